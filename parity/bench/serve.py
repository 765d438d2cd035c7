"""Serve tier of the benchmark: ``engine`` vs ``oracle`` HTTP servers, interleaved A/B.

Each repetition starts a fresh server per side (engine and oracle alternately; the side that
goes first alternates between repetitions, so drift in the machine's load hits both), times
startup to the first ``/health`` 200 (polled every 50 ms from just before ``Popen``), sends one
unmeasured warm-up stream, runs every load (``parity.bench.loads``) on that server and stops it
(SIGTERM, grace, SIGKILL of the process group), recording how long the exit took. Both sides
get the same flags: float32, block size 32, ``--enforce-eager --no-async-scheduling``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from parity.bench.loads import (
    LIMITS,
    METRIC_KEYS,
    MIB,
    WARMUP,
    Load,
    LoadMetrics,
    load_request,
    run_load,
    tree_rss,
)
from parity.bench.stats import median, ratio, rounded
from parity.process import StartupError
from parity.serve import ServerConfig, ServerHandle, parse_target, run_serve
from parity.serve.launch import launch, recipe

SIDES = ("engine", "oracle")
STARTUP_TIMEOUT_S = LIMITS.startup_timeout_s
HEALTH_POLL_S = 0.05

Notify = Callable[[str], None]


def default_config(model: str | Path) -> ServerConfig:
    """Both sides' flags: float32, block size 32 (plus --enforce-eager --no-async-scheduling,
    which ``parity.serve`` always adds), the model's own max_model_len, 1 GiB of KV cache."""
    return ServerConfig(model=str(model), engine_args={"block_size": 32, "dtype": "float32"})


# --- one side, one repetition --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SideRep:
    """One fresh server of one side: its startup, each load, its shutdown."""

    side: str
    rep: int
    startup_s: float | None = None
    idle_rss_mib: float | None = None
    loads: tuple[LoadMetrics, ...] = ()
    shutdown_s: float | None = None
    sigterm_sufficed: bool | None = None
    error: str | None = None
    log: str | None = None

    def load(self, name: str) -> LoadMetrics | None:
        return next((m for m in self.loads if m.load == name), None)


def start_server(target: str, config: ServerConfig, log_path: Path) -> ServerHandle:
    """Start ``target`` fresh the one way servers start (``parity.serve.launch``, with its
    port-race retries), ``/health`` polled every 50 ms; StartupError when it did not start."""
    spec = parse_target(target)
    start = replace(recipe(spec, config, STARTUP_TIMEOUT_S), poll_s=HEALTH_POLL_S)
    record, process = launch(start, lambda: log_path)
    if process is None or not record.started:
        raise StartupError(record.error or record.outcome, log_tail=record.log_tail,
                           returncode=record.returncode)  # fmt: skip
    return ServerHandle(spec, config, record, process)


def run_side(
    side: str,
    rep: int,
    config: ServerConfig,
    loads: Sequence[Load],
    log_dir: Path,
    notify: Notify,
) -> SideRep:
    """Start ``side`` fresh, run the warm-up and every load, stop it."""
    log_path = log_dir / f"serve-{side}-rep{rep}.log"
    notify(f"{side} rep {rep + 1}: starting")
    try:
        handle = start_server(side, config, log_path)
    except StartupError as exc:
        tail = exc.log_tail.strip().splitlines()
        failed = f"startup failed: {exc}" + (f" ({tail[-1]})" if tail else "")
        notify(f"{side} rep {rep + 1}: {failed}")
        return SideRep(side=side, rep=rep, error=failed, log=str(log_path))
    results: list[LoadMetrics] = []
    error: str | None = None
    try:
        assert handle.process is not None
        idle = tree_rss(handle.process.pid)
        notify(f"{side} rep {rep + 1}: healthy after {handle.startup.startup_s:.1f} s")
        run_serve(handle, [load_request(WARMUP)], LIMITS, poll_s=1.0)
        for load in loads:
            notify(f"{side} rep {rep + 1}: {load.name}")
            results.append(run_load(handle, load))
    except Exception as exc:  # noqa: BLE001 (recorded; the other side and reps still run)
        error = f"{type(exc).__name__}: {exc}"
    finally:
        stop = handle.stop(grace_s=10.0)
    return SideRep(
        side=side,
        rep=rep,
        startup_s=handle.startup.startup_s,
        idle_rss_mib=round(idle / MIB, 1),
        loads=tuple(results),
        shutdown_s=round(stop.exit_s, 3) if stop else None,
        sigterm_sufficed=stop.sigterm_sufficed if stop else None,
        error=error,
        log=str(log_path),
    )


# --- the whole tier -------------------------------------------------------------------------


@dataclass
class ServeTier:
    """Every repetition of both sides, and the medians and ratios over them."""

    loads: tuple[Load, ...]
    reps: list[SideRep] = field(default_factory=list)

    def side(self, side: str) -> list[SideRep]:
        return [r for r in self.reps if r.side == side]

    def startup(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for side in SIDES:
            samples = [r.startup_s for r in self.side(side) if r.startup_s is not None]
            out[side] = {"samples_s": samples, "median_s": rounded(median(samples))}
        out["speedup"] = rounded(ratio(out["oracle"]["median_s"], out["engine"]["median_s"]), 2)
        return out

    def load_summary(self, load: Load) -> dict[str, Any]:
        summary: dict[str, Any] = asdict(load)
        for side in SIDES:
            runs = [m for r in self.side(side) if (m := r.load(load.name)) is not None]
            summary[side] = {key: median(getattr(m, key) for m in runs) for key in METRIC_KEYS}
            summary[side]["completed"] = [m.completed for m in runs]
            summary[side]["problems"] = [p for m in runs for p in m.problems][:5]
        summary["ratio"] = {
            key: rounded(ratio(summary["engine"][key], summary["oracle"][key]), 3)
            for key in METRIC_KEYS
        }
        return summary

    def to_json(self) -> dict[str, Any]:
        idle = {s: median(r.idle_rss_mib for r in self.side(s)) for s in SIDES}
        shutdown = {s: median(r.shutdown_s for r in self.side(s)) for s in SIDES}
        return {
            "repetitions": max((r.rep + 1 for r in self.reps), default=0),
            "order": [f"{r.side}#{r.rep + 1}" for r in self.reps],
            "startup": self.startup(),
            "idle_rss_mib": idle,
            "shutdown_s": shutdown,
            "loads": [self.load_summary(load) for load in self.loads],
            "runs": [asdict(r) for r in self.reps],
            "errors": [f"{r.side} rep {r.rep + 1}: {r.error}" for r in self.reps if r.error],
        }


def rep_order(rep: int) -> tuple[str, str]:
    """Engine first on even repetitions, the oracle first on odd ones."""
    return SIDES if rep % 2 == 0 else (SIDES[1], SIDES[0])


def run_serve_tier(
    config: ServerConfig,
    loads: Sequence[Load],
    repetitions: int,
    log_dir: Path,
    notify: Notify,
    advance: Callable[[], None] = lambda: None,
) -> ServeTier:
    """``repetitions`` rounds of (engine, oracle) in alternating order."""
    log_dir.mkdir(parents=True, exist_ok=True)
    tier = ServeTier(loads=tuple(loads))
    for rep in range(repetitions):
        for side in rep_order(rep):
            began = time.monotonic()
            tier.reps.append(run_side(side, rep, config, loads, log_dir, notify))
            notify(f"{side} rep {rep + 1}: done in {time.monotonic() - began:.1f} s")
            advance()
    return tier
