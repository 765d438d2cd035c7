"""Run a repro's legs on its targets and give each (leg, target) a verdict.

Legs are grouped by (tier, server config) in order of first appearance; for each group each
target's server starts once (``ServerPool``), runs the group's legs in file order and is
stopped before the next target's server starts (at most one server up: 2 cores). A server that
refuses to start gives every leg of the group ``startup_refused`` with its key log line.

A serve-tier leg sends its requests through ``parity.serve.client.observe_request`` (the
progress-based stall verdict: no byte and no token-counter change for ``stall_s``), on a
``HoldingTransport`` so a stalled request stays outstanding on the server after its verdict.
While it is held: the scheduler dump (our engine), a stack dump (py-spy, when installed), and,
for a ``sigterm`` leg, SIGTERM with the grace period. Then the held requests are released.
Scheduler-tier legs run in process through ``parity.runner.run_scenario``.

Each finished (leg, target) is handed to ``on_result`` at once, so the CLI prints verdicts as
they come. ``verdict.py`` turns the raw run into the outcome class.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import httpx

from parity.errors import TargetSpecError
from parity.repro.evidence import (
    SigtermRecord,
    WedgeEvidence,
    scheduler_dump,
    sigterm,
    stack_dump,
)
from parity.repro.hold import HoldingTransport
from parity.repro.spec import Leg, Repro
from parity.repro.verdict import TargetLeg, judge_scheduler, judge_serve, needs_confirming
from parity.serve.monitor import TargetMonitor
from parity.serve.observe import MetricsSnapshot
from parity.serve.pool import ServerHandle, ServerPool
from parity.serve.run import Watch, not_started, request_timeout, send_all
from parity.serve.spec import from_scenario
from parity.serve.targets import TargetSpec, parse_targets

OnResult = Callable[[TargetLeg], None]
LOG_TAIL_BYTES = 6000


class RecordingMonitor(TargetMonitor):
    """A ``TargetMonitor`` that keeps every ``/metrics`` snapshot (saturation evidence)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.snapshots: list[MetricsSnapshot] = []

    async def sample_metrics(self) -> MetricsSnapshot:
        snapshot = await super().sample_metrics()
        if snapshot.error is None:
            self.snapshots.append(snapshot)
        return snapshot


@dataclass(frozen=True, slots=True)
class ReproRun:
    """Every (leg, target) result of one repro, in leg order then target order."""

    repro: Repro
    targets: tuple[str, ...]  # labels
    results: tuple[TargetLeg, ...]
    elapsed_s: float
    legs_s: float  # time spent in legs (server starts excluded)

    def for_leg(self, name: str) -> list[TargetLeg]:
        return [r for r in self.results if r.leg == name]


def run_repro(
    repro: Repro,
    targets: Sequence[str] | None = None,
    *,
    pool: ServerPool | None = None,
    on_result: OnResult | None = None,
    legs: Sequence[str] | None = None,
) -> ReproRun:
    """Run every leg of ``repro`` (or the ones named in ``legs``) on every target (default:
    the file's ``targets``)."""
    specs = parse_targets(targets or repro.targets)  # TargetSpecError first; labels distinct
    names = [leg.name for leg in repro.legs]
    unknown = [n for n in legs or () if n not in names]
    if unknown:
        raise TargetSpecError(f"unknown leg {unknown[0]!r} (legs: {', '.join(names)})")
    chosen = [i for i, n in enumerate(names) if not legs or n in legs]
    own = pool is None
    active = pool if pool is not None else ServerPool()
    began = time.monotonic()
    legs_s = 0.0
    found: dict[tuple[int, str], TargetLeg] = {}
    try:
        for indexes in _groups(repro, chosen):
            tier = repro.legs[indexes[0]].tier
            for spec in specs:
                if tier == "scheduler":
                    for i in indexes:
                        result = _scheduler_leg(repro, i, spec)
                        legs_s += result.elapsed_s
                        found[(i, spec.label)] = _emit(result, on_result)
                    continue
                handle: ServerHandle | None = None
                for i in indexes:
                    scenario = repro.leg_scenario(i)
                    config = from_scenario(scenario)[0]
                    leg = repro.legs[i]
                    handle = active.get(
                        spec, config, startup_timeout_s=leg.limits.startup_timeout_s
                    )
                    result = asyncio.run(_serve_leg(repro, i, handle))
                    legs_s += result.elapsed_s
                    found[(i, spec.label)] = _emit(result, on_result)
                if handle is not None:
                    active.stop(handle)
        for i in chosen:
            legs_s += _confirm(repro, i, specs, active, found, on_result)
    finally:
        if own:
            active.close()
    ordered = [found[(i, s.label)] for i in chosen for s in specs]
    return ReproRun(
        repro=repro,
        targets=tuple(s.label for s in specs),
        results=tuple(ordered),
        elapsed_s=round(time.monotonic() - began, 3),
        legs_s=round(legs_s, 3),
    )


def _confirm(
    repro: Repro,
    index: int,
    specs: Sequence[TargetSpec],
    pool: ServerPool,
    found: dict[tuple[int, str], TargetLeg],
    on_result: OnResult | None,
) -> float:
    """Rerun leg ``index`` once on a fresh server for each target whose verdict is a timing
    verdict (``needs_confirming``); keep the rerun, ``flaky``, if it no longer is one, else the
    first attempt with the rerun as its confirmation. Returns the seconds spent in reruns."""
    leg = repro.legs[index]
    spent = 0.0
    for spec in specs:
        first = found[(index, spec.label)]
        others = [found[(index, s.label)] for s in specs if s.label != spec.label]
        if not needs_confirming(leg, first, others):
            continue
        config = from_scenario(repro.leg_scenario(index))[0]
        handle = pool.get(spec, config, startup_timeout_s=leg.limits.startup_timeout_s, fresh=True)
        try:
            again = asyncio.run(_serve_leg(repro, index, handle))
        finally:
            pool.stop(handle)
        spent += again.elapsed_s
        if again.startup == "started" and not again.expect_failures:
            if not needs_confirming(leg, again, others):
                found[(index, spec.label)] = _emit(
                    replace(again, flaky=True, other_attempt=first), on_result
                )
                continue
        found[(index, spec.label)] = _emit(replace(first, other_attempt=again), on_result)
    return spent


def _emit(result: TargetLeg, on_result: OnResult | None) -> TargetLeg:
    if on_result is not None:
        on_result(result)
    return result


def _groups(repro: Repro, chosen: Sequence[int]) -> list[list[int]]:
    groups: dict[str, list[int]] = {}
    for i in chosen:
        leg = repro.legs[i]
        config = from_scenario(repro.leg_scenario(i))[0]
        key = json.dumps([leg.tier, config.to_json()], sort_keys=True, default=str)
        groups.setdefault(key, []).append(i)
    return list(groups.values())


# ------------------------------------------------------------------------------ serve tier
async def _serve_leg(repro: Repro, index: int, handle: ServerHandle) -> TargetLeg:
    leg = repro.legs[index]
    scenario = repro.leg_scenario(index)
    _, requests, limits = from_scenario(scenario)
    if not handle.startup.started:
        return judge_serve(leg, scenario, not_started(handle, requests, limits), elapsed_s=0.0)
    watch = Watch(handle, limits, leg.limits.poll_s, RecordingMonitor)
    monitor = watch.monitor
    transport = HoldingTransport()
    evidence: WedgeEvidence | None = None
    term: SigtermRecord | None = None
    try:
        await watch.start()
        timeout = request_timeout(limits)
        async with httpx.AsyncClient(transport=transport, timeout=timeout) as client:
            observations = await send_all(
                handle, requests, limits, monitor, watch.facts, client=client
            )
            held = transport.held
            stalled = any(o.stall is not None for o in observations)
            if stalled or leg.sends_sigterm:
                evidence = await _evidence(handle, monitor)
            if leg.sends_sigterm:
                term = await sigterm(handle, leg.limits.sigterm_grace_s, len(held), held)
            await watch.finish()
            await transport.release()
    finally:
        await transport.aclose()
        await watch.aclose()
    run = watch.result(
        observations,
        log_tail=handle.log_tail(LOG_TAIL_BYTES),
        sigterm=term.label if term is not None else None,
    )
    return judge_serve(
        leg,
        scenario,
        run,
        elapsed_s=run.elapsed_s,
        evidence=evidence,
        sigterm=term,
        snapshots=tuple(monitor.snapshots),
    )


async def _evidence(handle: ServerHandle, monitor: TargetMonitor) -> WedgeEvidence:
    (dump, dump_note), (stack, stack_note) = await asyncio.gather(
        scheduler_dump(handle), stack_dump(handle)
    )
    return WedgeEvidence(
        scheduler=dump,
        scheduler_note=dump_note,
        stack=stack,
        stack_note=stack_note,
        t_ms=monitor.ms(time.monotonic()),
    )


# -------------------------------------------------------------------------- scheduler tier
def _scheduler_leg(repro: Repro, index: int, spec: TargetSpec) -> TargetLeg:
    from parity.runner import run_target
    from parity.targets import make_target, shutdown_targets

    leg: Leg = repro.legs[index]
    scenario = repro.leg_scenario(index)
    began = time.monotonic()
    target = make_target(spec.spec, "scheduler")
    try:
        run = run_target(scenario, target)  # type: ignore[arg-type]
    finally:
        shutdown_targets([target])
    return judge_scheduler(leg, spec.label, run.summary, elapsed_s=time.monotonic() - began)
