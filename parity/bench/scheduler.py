"""Scheduler tier of the benchmark: our scheduler's step time vs upstream's, and the
differential rate (random scenarios per second through both targets).

Step time: the workloads of ``parity.bench_scheduler`` (8 and 64 requests, ample and tight KV)
run to completion on the ``engine`` and ``oracle`` scheduler-tier targets, interleaved (the
target that goes first alternates per repetition) after one untimed warm-up run each (the
first run pays one-off caches: up to 20x a later one). The time is process CPU time spent in
``step()`` (the machine is shared: wall time would count other processes), divided by the
number of steps; medians over the repetitions. The two targets' traces are compared, so a
speed is never reported for runs that disagree. Upstream: the oracle target drives
``vllm/v1/core/sched/scheduler.py`` at the pin, as ``tests/v1/core/utils.py`` does.

Differential rate: ``parity.bench.differential`` draws seeded random scenarios and runs each
on both targets with ``parity.runner.run_scenario`` (diff included), as the differential
property test does; examples/s is the number of scenarios over the wall time of those runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from contract.trace import StepTrace
from parity.bench.differential import random_scenario
from parity.bench.stats import median, ratio, rounded
from parity.bench_scheduler import make_workload, run_once
from parity.runner import run_scenario
from parity.targets import make_target
from parity.targets.base import SchedulerTarget

SIDES = ("engine", "oracle")
Notify = Callable[[str], None]


def make_targets(model: str) -> dict[str, SchedulerTarget]:
    """The two scheduler-tier targets on ``model`` (the oracle's vllm import is paid here)."""
    targets: dict[str, SchedulerTarget] = {}
    for side in SIDES:
        target = make_target(f"{side}:{model}", tier="scheduler")
        if not isinstance(target, SchedulerTarget):
            raise TypeError(f"{side} is not a scheduler-tier target")
        target.name = side
        targets[side] = target
    return targets


def step_times(
    targets: dict[str, SchedulerTarget],
    num_requests: int,
    kv: str,
    repetitions: int,
) -> dict[str, Any]:
    """One workload, ``repetitions`` interleaved runs per target: ms/step, ratio, agreement."""
    workload = make_workload(num_requests, kv)
    cpu: dict[str, list[float]] = {side: [] for side in SIDES}
    steps: dict[str, int] = {}
    first: dict[str, list[StepTrace]] = {}
    for side in SIDES:  # warm-up, untimed: the first run pays one-off caches and imports
        run_once(targets[side], workload, "targets")
    for rep in range(repetitions):
        order = SIDES if rep % 2 == 0 else SIDES[::-1]
        for side in order:
            traces, elapsed = run_once(targets[side], workload, "targets")
            cpu[side].append(elapsed)
            steps[side] = len(traces)
            first.setdefault(side, traces)
    result: dict[str, Any] = {
        "workload": workload.name,
        "requests": num_requests,
        "kv": kv,
        "steps": steps,
        "traces_agree": first["engine"] == first["oracle"],
    }
    for side in SIDES:
        per_step = [1000.0 * c / max(steps[side], 1) for c in cpu[side]]
        result[side] = {
            "ms_per_step_median": rounded(median(per_step), 4),
            "ms_per_step_best": rounded(min(per_step), 4),
            "cpu_s": [round(c, 4) for c in cpu[side]],
        }
    result["ratio"] = rounded(
        ratio(result["engine"]["ms_per_step_median"], result["oracle"]["ms_per_step_median"]), 3
    )
    return result


def differential_rate(
    targets: dict[str, SchedulerTarget], examples: int, *, seed: int = 0
) -> dict[str, Any]:
    """``examples`` random scenarios through both targets (``run_scenario``): examples/s."""
    wall = 0.0
    cpu = 0.0
    statuses: dict[str, int] = {}
    diverged: list[str] = []
    for index in range(examples):
        scenario = random_scenario(seed + index)
        began, began_cpu = time.perf_counter(), time.process_time()
        result, _runs = run_scenario(scenario, [targets["engine"], targets["oracle"]])
        wall += time.perf_counter() - began
        cpu += time.process_time() - began_cpu
        status = str(getattr(result.status, "value", result.status))
        statuses[status] = statuses.get(status, 0) + 1
        if result.divergences:
            diverged.append(f"seed {seed + index}: {result.verdict}")
    return {
        "examples": examples,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "examples_per_s": rounded(ratio(float(examples), wall), 2),
        "examples_per_cpu_s": rounded(ratio(float(examples), cpu), 2),
        "statuses": statuses,
        "divergences": diverged[:10],
        "generator": "parity.bench.differential.random_scenario (seeded)",
    }


def run_scheduler_tier(
    model: str,
    *,
    requests: Sequence[int],
    kv: Sequence[str],
    repetitions: int,
    differential_examples: int,
    notify: Notify,
    advance: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """Both scheduler-tier measurements; errors are recorded, not raised."""
    out: dict[str, Any] = {"repetitions": repetitions, "workloads": [], "errors": []}
    notify("scheduler: importing the targets (vllm import, once)")
    began = time.perf_counter()
    try:
        targets = make_targets(model)
    except Exception as exc:  # noqa: BLE001 (the report says why the tier is missing)
        out["errors"].append(f"targets: {type(exc).__name__}: {exc}")
        return out
    out["setup_s"] = round(time.perf_counter() - began, 2)
    advance()
    for num_requests in requests:
        for kind in kv:
            notify(f"scheduler: {num_requests} requests, {kind} KV")
            try:
                row = step_times(targets, num_requests, kind, repetitions)
            except Exception as exc:  # noqa: BLE001
                out["errors"].append(f"{num_requests} req {kind}: {type(exc).__name__}: {exc}")
            else:
                out["workloads"].append(row)
                if not row["traces_agree"]:
                    out["errors"].append(f"{row['workload']}: the targets' traces differ")
            advance()
    notify(f"scheduler: differential, {differential_examples} random scenarios")
    try:
        out["differential"] = differential_rate(targets, differential_examples)
    except Exception as exc:  # noqa: BLE001
        out["errors"].append(f"differential: {type(exc).__name__}: {exc}")
    advance()
    return out
