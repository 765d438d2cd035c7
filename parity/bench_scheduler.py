"""Scheduler-tier throughput: steps/s of the ``engine`` and ``oracle`` targets on one workload.

Both targets run the same deterministic workloads (8 and 64 requests; ample KV and tight KV,
where preemptions happen) through the target interface (``parity.targets``), so the numbers
are what a differential run pays per step. Times are process CPU time (the machine is shared;
wall time would count other processes). The oracle's one-off vllm import is paid before
timing starts. Each run's traces are compared (step count and full equality) so a benchmark
never reports the speed of two runs that disagree.

    python -m parity.bench_scheduler [--requests 8 64] [--kv ample tight] [--repeat 3]
        [--script targets|module]

``--script targets`` (default) measures the targets as they are wired; ``--script module`` sets
each target's script to ``contract.scripted.script`` itself after ``start`` (the runners then use
its incremental ``ScriptState``). Not a test: prints a table.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from contract.scripted import vocab
from contract.trace import StepTrace
from parity.scenario import ConfigSpec, RequestSpec
from parity.targets import make_target
from parity.targets.base import SchedulerTarget

BLOCK_SIZE = 16
MAX_STEPS = 20_000


@dataclass(frozen=True)
class Workload:
    name: str
    config: ConfigSpec
    requests: tuple[RequestSpec, ...]


def _prompt(i: int) -> list[int]:
    """A prompt of 16..112 byte tokens (no selectors); every 4th ends in a count-down number."""
    length = 16 + (i * 37) % 97
    body = [ord("a") + (i + j) % 26 for j in range(length)]
    if i % 4 == 3:
        body[-1] = vocab.number(3 + i % 5)
    return [vocab.BOS, *body]


def make_workload(num_requests: int, kv: str) -> Workload:
    """``num_requests`` requests of 64..192 output tokens; ``kv`` ample (no preemption) or
    tight (about a third of the blocks the batch needs, never less than one request needs)."""
    requests: list[RequestSpec] = []
    needs: list[int] = []
    for i in range(num_requests):
        prompt = _prompt(i)
        max_tokens = 64 + (i * 53) % 129
        requests.append(
            RequestSpec(
                id=f"r{i}",
                prompt_token_ids=prompt,
                max_tokens=max_tokens,
                ignore_eos=i % 4 != 3,  # count-down prompts stop at EOS after min_tokens
                min_tokens=8 if i % 4 == 3 else 0,
                at_step=i % 5,
            )
        )
        needs.append(math.ceil((len(prompt) + max_tokens) / BLOCK_SIZE))
    ample = sum(needs) + 1
    num_blocks = ample if kv == "ample" else max(max(needs) + 2, ample // 3)
    config = ConfigSpec(
        block_size=BLOCK_SIZE,
        num_gpu_blocks_override=num_blocks,
        max_model_len=2048,
        max_num_batched_tokens=512,
        enable_prefix_caching=True,
    )
    return Workload(f"{num_requests} req, {kv} kv ({num_blocks} blocks)", config, tuple(requests))


def run_once(
    target: SchedulerTarget, workload: Workload, script: str
) -> tuple[list[StepTrace], float]:
    """Run ``workload`` to completion on ``target``; (traces, CPU seconds spent in ``step``)."""
    target.start(workload.config)
    if script == "module":
        _use_module_script(target)
    pending = sorted(workload.requests, key=lambda r: r.at_step)
    outstanding: set[str] = set()
    traces: list[StepTrace] = []
    elapsed = 0.0
    try:
        while len(traces) < MAX_STEPS:
            while pending and pending[0].at_step <= len(traces):
                request = pending.pop(0)
                target.submit(request)
                outstanding.add(request.id)
            if not pending and not outstanding:
                break
            began = time.process_time()
            trace = target.step()
            elapsed += time.process_time() - began
            traces.append(trace)
            outstanding.difference_update(trace.finished)
    finally:
        target.close()
    return traces, elapsed


def _use_module_script(target: SchedulerTarget) -> None:
    from contract.scripted import script

    core = getattr(target, "core", None)
    if core is not None:
        core.runner.script = script
    scheduler = getattr(target, "scheduler", None)
    if scheduler is not None:
        scheduler.script = script


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--kv", nargs="+", choices=["ample", "tight"], default=["ample", "tight"])
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs per target")
    parser.add_argument("--script", choices=["targets", "module"], default="targets")
    parser.add_argument("--target", action="append", dest="targets")
    parser.add_argument("--model", help="model folder (default: the built scripted model)")
    args = parser.parse_args(argv)
    names = args.targets or ["engine", "oracle"]
    with tempfile.TemporaryDirectory(prefix="bench-model-") as scratch:
        model = args.model or _scripted_model(Path(scratch))
        began = time.perf_counter()
        targets = {name: _scheduler_target(f"{name}:{model}") for name in names}
        print(f"targets ready in {time.perf_counter() - began:.1f} s (one-off imports)")
        print(f"script: {args.script}; CPU time, best of {args.repeat}")
        header = " ".join(f"{n + ' steps/s':>15} {n + ' ms/step':>15}" for n in names)
        print(f"{'workload':34} {'steps':>6} {header}")
        for num_requests in args.requests:
            for kv in args.kv:
                _bench(targets, make_workload(num_requests, kv), args.repeat, args.script)
    return 0


def _scripted_model(scratch: Path) -> str:
    """The built scripted model folder, or a fresh build in ``scratch`` (well under 1 s)."""
    from contract.scripted.builder import build

    built = Path(__file__).resolve().parents[1] / ".cache" / "models" / "scripted"
    if (built / "config.json").exists():
        return str(built)
    build("scripted", scratch)
    return str(scratch)


def _scheduler_target(spec: str) -> SchedulerTarget:
    target = make_target(spec, tier="scheduler")
    if not isinstance(target, SchedulerTarget):
        raise SystemExit(f"{spec} is not a scheduler-tier target")
    return target


def _bench(
    targets: dict[str, SchedulerTarget], workload: Workload, repeat: int, script: str
) -> None:
    """One table row: best-of-``repeat`` steps/s per target; the targets' traces must agree."""
    names = list(targets)
    row: list[str] = []
    reference: list[StepTrace] | None = None
    for name, target in targets.items():
        best = math.inf
        for _ in range(repeat):
            traces, elapsed = run_once(target, workload, script)
            best = min(best, elapsed)
        if reference is None:
            reference = traces
        elif traces != reference:
            raise SystemExit(f"{workload.name}: {name} diverges from {names[0]}")
        row.append(f"{len(traces) / best:15.0f} {1000 * best / len(traces):15.3f}")
    assert reference is not None
    print(f"{workload.name:34} {len(reference):6d} " + " ".join(row), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
