"""Decode-step latency of the model runner: ``python -m engine.worker.benchmark MODEL_DIR``.

Upstream: none (vLLM's ``benchmarks/`` time whole servers; this times the runner alone).
Prefills ``batch`` requests in one step, then runs ``steps`` decode steps for all of them with
hand-built scheduler outputs, and prints the median wall and process-CPU milliseconds per decode
step and the implied output tokens/s. On a shared machine the CPU time (single thread) is the
better estimate of an idle run. Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from engine.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from engine.sampling_params import SamplingParams
from engine.worker.model_runner import ModelRunner


def _prefill(
    runner: ModelRunner, prompt: list[int], all_blocks: dict[str, list[int]]
) -> dict[str, list[int]]:
    """Admit every request with the blocks its prompt needs; returns the blocks held."""
    needed = (len(prompt) + runner.block_size - 1) // runner.block_size
    blocks = {r: ids[:needed] for r, ids in all_blocks.items()}
    params = SamplingParams(temperature=0.0, max_tokens=None)
    new = [NewRequestData(r, list(prompt), params, b[:], 0) for r, b in blocks.items()]
    runner.execute_model(
        SchedulerOutput(
            scheduled_new_reqs=new,
            scheduled_cached_reqs=CachedRequestData(),
            num_scheduled_tokens={r: len(prompt) for r in blocks},
            total_num_scheduled_tokens=len(prompt) * len(blocks),
            finished_req_ids=set(),
        )
    )
    return blocks


def _decode_output(
    req_ids: list[str], num_computed: int, num_output: int, new_blocks: dict[str, list[int]]
) -> SchedulerOutput:
    return SchedulerOutput(
        scheduled_new_reqs=[],
        scheduled_cached_reqs=CachedRequestData(
            req_ids=list(req_ids),
            new_block_ids=[new_blocks.get(r) for r in req_ids],
            num_computed_tokens=[num_computed] * len(req_ids),
            num_output_tokens=[num_output] * len(req_ids),
        ),
        num_scheduled_tokens=dict.fromkeys(req_ids, 1),
        total_num_scheduled_tokens=len(req_ids),
        finished_req_ids=set(),
    )


def run(
    model_dir: Path,
    batch: int,
    steps: int,
    prompt_len: int,
    dtype: torch.dtype,
    num_threads: int | None = None,
) -> tuple[float, float]:
    """Median wall and process-CPU ms per decode step for ``batch`` concurrent requests."""
    block_size = 32
    total = prompt_len + steps + 1
    per_req = (total + block_size - 1) // block_size + 1
    runner = ModelRunner(
        model_dir,
        num_blocks=batch * per_req + 2,
        block_size=block_size,
        dtype=dtype,
        num_threads=num_threads,
    )
    prompt = [389] + [382] * (prompt_len - 1)  # BOS, then " tick"s: the script never ends
    all_blocks = {
        f"r{i}": list(range(1 + i * per_req, 1 + (i + 1) * per_req)) for i in range(batch)
    }
    held = _prefill(runner, prompt, all_blocks)
    wall, cpu = [], []
    for step in range(steps):
        num_computed = prompt_len + step
        new_blocks = {}
        for r, ids in held.items():
            if (num_computed + 1 + block_size - 1) // block_size > len(ids):
                new_blocks[r] = [all_blocks[r][len(ids)]]
                ids.extend(new_blocks[r])
        output = _decode_output(list(held), num_computed, step + 1, new_blocks)
        start, start_cpu = time.perf_counter(), time.process_time()
        runner.execute_model(output)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--threads", type=int, default=None, help="default: the runner's")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    for batch in args.batch:
        ms, cpu_ms = run(args.model_dir, batch, args.steps, args.prompt_len, dtype, args.threads)
        print(
            f"batch {batch:3d}: {ms:6.2f} ms/decode step ({batch * 1e3 / ms:5.0f} tok/s),"
            f" cpu {cpu_ms:6.2f} ms ({batch * 1e3 / cpu_ms:5.0f} tok/s if alone),"
            f" {torch.get_num_threads()} thread(s), {args.dtype}"
        )


if __name__ == "__main__":
    main()
