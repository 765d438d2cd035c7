"""The speed targets the benchmark prints against (the acceptance numbers of the serve tier).

Each line is pass / fail / not measured in the results table; nothing here is asserted in a
test (the numbers depend on the machine and its load).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class TargetLine:
    """One target: what was measured against which threshold."""

    id: str
    goal: str  # e.g. "engine startup >= 7x faster than the oracle"
    measured: float | None
    shown: str  # the measured value as the table shows it
    threshold: float
    higher_is_better: bool
    passed: bool | None  # None: not measured
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _line(
    id_: str,
    goal: str,
    measured: float | None,
    threshold: float,
    *,
    higher: bool,
    unit: str,
    note: str = "",
) -> TargetLine:
    passed = None
    if measured is not None:
        passed = measured >= threshold if higher else measured <= threshold
    shown = "not measured" if measured is None else f"{measured:.2f}{unit}"
    return TargetLine(id_, goal, measured, shown, threshold, higher, passed, note)


def _load(serve: dict[str, Any] | None, role: str) -> dict[str, Any] | None:
    for load in (serve or {}).get("loads", []):
        if load.get("role") == role:
            return load  # type: ignore[no-any-return]
    return None


def _tok_ratio(load: dict[str, Any] | None) -> float | None:
    return None if load is None else load["ratio"].get("output_tok_s")


def evaluate(results: dict[str, Any]) -> list[TargetLine]:
    """Every target line from a results dict (``results.json``'s shape)."""
    serve = results.get("serve")
    scheduler = results.get("scheduler") or {}
    harness = results.get("harness") or {}
    single, mid, high = _load(serve, "single"), _load(serve, "mid"), _load(serve, "high")
    single_name = single["name"] if single else "1x256"
    mid_name = mid["name"] if mid else "8x128"
    high_name = high["name"] if high else "32x128"
    speedup = (serve or {}).get("startup", {}).get("speedup")
    ratios = [w["ratio"] for w in scheduler.get("workloads", []) if w.get("ratio") is not None]
    worst = max(ratios) if ratios else None
    worst_name = next((w["workload"] for w in scheduler.get("workloads", [])
                       if w.get("ratio") == worst), "")  # fmt: skip
    diff = (scheduler.get("differential") or {}).get("examples_per_s")
    wedge = (harness.get("wedge") or {}).get("verdict_latency_s")
    suite = harness.get("default_suite") or {}
    repeat = harness.get("repeat_suite") or {}
    clone = harness.get("fresh_clone") or {}
    return [
        _line("startup", "engine startup to /health >= 7x faster than the oracle", speedup,
              7.0, higher=True, unit="x", note="oracle median / engine median"),
        _line("single_stream", f"single-stream decode ({single_name}) >= 1.0x oracle tok/s",
              _tok_ratio(single), 1.0, higher=True, unit="x"),
        _line("mid_concurrency", f"{mid_name} concurrent streams >= 1.0x oracle tok/s",
              _tok_ratio(mid), 1.0, higher=True, unit="x"),
        _line("concurrent", f"{high_name} concurrent streams >= 0.5x oracle tok/s",
              _tok_ratio(high), 0.5, higher=True, unit="x"),
        _line("concurrent_stretch", f"{high_name} concurrent streams >= 1.0x (stretch)",
              _tok_ratio(high), 1.0, higher=True, unit="x"),
        _line("scheduler_step", "scheduler step time <= 1.0x upstream's (worst workload)",
              worst, 1.0, higher=False, unit="x", note=worst_name),
        _line("differential", "scheduler-tier differential >= 30 examples/s", diff, 30.0,
              higher=True, unit="/s"),
        _line("wedge_verdict", "wedge verdict <= 5 s after the last progress", wedge, 5.0,
              higher=False, unit=" s", note=(harness.get("wedge") or {}).get("target", "")),
        _line("default_suite", "default suite, both tiers, engine vs oracle <= 75 s",
              _both(suite), 75.0, higher=False, unit=" s", note=_load_note([suite])),
        _line("repeat_suite", "the same suite again, oracles lent by `parity broker` <= 75 s",
              _both(repeat), 75.0, higher=False, unit=" s",
              note=repeat.get("note") or _load_note([repeat])),
        _line("fresh_clone", "git clone to the make parity verdict <= 120 s (warm cache)",
              clone.get("elapsed_s"), 120.0, higher=False, unit=" s",
              note=clone.get("note") or _load_note([clone])),
    ]  # fmt: skip


def _both(suite: dict[str, Any]) -> float | None:
    """A suite's wall time if it ran both tiers (a --quick run times the scheduler tier only)."""
    return suite.get("elapsed_s") if suite.get("tier") == "both" else None


def _load_note(runs: Any) -> str:
    """The load averages (1 min) a wall time was measured at, before -> after."""
    seen = [f"{r['loadavg_before'][0]:.1f}->{r['loadavg_after'][0]:.1f}"
            for r in runs if r.get("loadavg_before")]  # fmt: skip
    return f"load {', '.join(seen)}" if seen else ""
