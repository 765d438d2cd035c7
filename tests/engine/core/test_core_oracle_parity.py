"""Cross-check: our engine core and the pinned upstream Scheduler give identical StepTraces.

The oracle side is ``oracle.scheduler_adapter.run`` (upstream's real ``Scheduler`` with the same
scripted fake model). This is a small fixed set plus a short random sweep; the full differential
suite lives in tests/parity.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from contract.scripted import script, vocab
from contract.trace import StepTrace
from engine.config import EngineConfig
from engine.core.engine_core import EngineCore
from engine.core.fake_runner import ScriptedModelRunner
from engine.core.step_trace import traced_step
from engine.request import Request
from engine.sampling_params import SamplingParams

pytestmark = [pytest.mark.oracle, pytest.mark.timeout(600)]


def _engine_run(
    config: dict[str, Any], requests: list[dict[str, Any]], max_steps: int
) -> list[StepTrace]:
    """Same driving rules as ``oracle.scheduler_adapter.run``."""
    cfg = EngineConfig(**{k: v for k, v in config.items() if k != "num_gpu_blocks_override"})
    core = EngineCore(
        cfg, ScriptedModelRunner(script, cfg.block_size), config["num_gpu_blocks_override"]
    )
    pending = sorted(enumerate(requests), key=lambda e: (e[1].get("at_step", 0), e[0]))
    traces: list[StepTrace] = []
    cursor = 0
    while len(traces) < max_steps:
        while cursor < len(pending) and pending[cursor][1].get("at_step", 0) <= len(traces):
            item = pending[cursor][1]
            params = SamplingParams(
                max_tokens=item["max_tokens"],
                min_tokens=item.get("min_tokens", 0),
                ignore_eos=item.get("ignore_eos", False),
                stop_token_ids=list(item.get("stop_token_ids", ())),
                temperature=0.0,
            )
            params.update_from_generation_config({"eos_token_id": vocab.EOS}, vocab.EOS)
            core.add_request(
                Request(
                    item["request_id"],
                    item["prompt_token_ids"],
                    params,
                    arrival_time=float(cursor),
                    priority=item.get("priority", 0),
                )
            )
            cursor += 1
        if cursor == len(pending) and not core.has_unfinished_requests():
            break
        traces.append(traced_step(core)[1])
    return traces


def _first_divergence(ours: list[StepTrace], theirs: list[StepTrace]) -> str | None:
    for a, b in zip(ours, theirs, strict=False):
        if a != b:
            x, y = a.to_json(), b.to_json()
            return f"step {a.step}: " + ", ".join(
                f"{k}: {x[k]} != {y[k]}" for k in x if x[k] != y[k]
            )
    if len(ours) != len(theirs):
        return f"{len(ours)} steps != {len(theirs)} steps"
    return None


def _p(base: int, n: int) -> list[int]:
    return [vocab.BOS] + [base + i for i in range(n - 1)]


def _r(rid: str, prompt: list[int], max_tokens: int, **kw: Any) -> dict[str, Any]:
    return {"request_id": rid, "prompt_token_ids": prompt, "max_tokens": max_tokens, **kw}


WEDGE = [vocab.BOS, vocab.answer_selector(20), vocab.think_selector(3)]
CASES: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {
    "s9": (
        {"num_gpu_blocks_override": 4, "max_model_len": 48},
        [_r("A", _p(100, 10), 16, ignore_eos=True), _r("B", _p(200, 10), 16, ignore_eos=True)],
    ),
    "s9-shared-prompt": (
        {"num_gpu_blocks_override": 4, "max_model_len": 48},
        [_r("A", _p(100, 10), 16, ignore_eos=True), _r("B", _p(100, 10), 16, ignore_eos=True)],
    ),
    "s10": (
        {"num_gpu_blocks_override": 5, "max_model_len": 64},
        [_r("A", _p(100, 30), 10, ignore_eos=True), _r("B", _p(200, 30), 20, ignore_eos=True)],
    ),
    "s11": (
        {"num_gpu_blocks_override": 5, "max_model_len": 64},
        [
            _r("R1", _p(100, 40), 8, ignore_eos=True),
            _r("R2", _p(200, 30), 4, ignore_eos=True, at_step=1),
            _r("R3", _p(300, 5), 4, ignore_eos=True, at_step=1),
        ],
    ),
    "s12": (
        {
            "num_gpu_blocks_override": 64,
            "max_model_len": 64,
            "max_num_batched_tokens": 32,
            "max_num_seqs": 2,
        },
        [_r("A", _p(100, 20), 4, ignore_eos=True), _r("B", _p(200, 20), 4, ignore_eos=True)],
    ),
    "s14": (
        {"num_gpu_blocks_override": 5, "max_model_len": 64, "scheduling_policy": "priority"},
        [
            _r("A", _p(100, 30), 10, ignore_eos=True, priority=1),
            _r("B", _p(200, 29), 10, ignore_eos=True, at_step=1),
        ],
    ),
    "wedge-bs16": (
        {"num_gpu_blocks_override": 4, "max_model_len": 2048},
        [_r("r1", WEDGE, 56, ignore_eos=True)],
    ),
    "wedge-control-5-blocks": (
        {"num_gpu_blocks_override": 5, "max_model_len": 2048},
        [_r("r1", WEDGE, 56, ignore_eos=True)],
    ),
    "wedge-control-bs32": (
        {"num_gpu_blocks_override": 4, "max_model_len": 2048, "block_size": 32},
        [_r("r1", WEDGE, 56, ignore_eos=True)],
    ),
    "min-tokens-stop-ids": (
        {"num_gpu_blocks_override": 20, "max_model_len": 64},
        [
            _r(
                "A", [vocab.BOS, vocab.number(3)], 8, min_tokens=3, stop_token_ids=[vocab.number(1)]
            ),
            _r("B", [vocab.BOS, vocab.number(2)], 10, min_tokens=6, ignore_eos=True),
        ],
    ),
}


def _random_case(rng: random.Random) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    max_model_len = rng.choice([64, 128, 256])
    max_num_seqs = rng.choice([1, 2, 3, 8])
    chunked = rng.random() < 0.7
    budget = max(rng.choice([16, 32, 64, 512]), max_num_seqs, 0 if chunked else max_model_len)
    config = {
        "block_size": rng.choice([16, 32]),
        "num_gpu_blocks_override": rng.randint(2, 12),
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": budget,
        "enable_chunked_prefill": chunked,
        "enable_prefix_caching": rng.random() < 0.7,
        "scheduling_policy": rng.choice(["fcfs", "priority"]),
        "long_prefill_token_threshold": rng.choice([0, 0, 8, 20]),
    }
    shared = [vocab.BOS] + [rng.randrange(0, 380) for _ in range(rng.randint(0, 40))]
    requests = []
    for i in range(rng.randint(1, 8)):
        tail = [rng.randrange(0, 380) for _ in range(rng.randint(1, 50))]
        max_tokens = rng.randint(1, 40)
        requests.append(
            _r(
                f"r{i}",
                (shared + tail)[: max_model_len - 1],
                max_tokens,
                min_tokens=rng.choice([0, 0, min(max_tokens, 5)]),
                ignore_eos=rng.random() < 0.5,
                stop_token_ids=rng.choice([[], [vocab.number(0)]]),
                priority=rng.randint(0, 2),
                at_step=rng.choice([0, 0, 1, 3, 7]),
            )
        )
    return config, requests


@pytest.fixture(scope="module")
def oracle_run(scripted_model_dir: Path) -> Any:
    from oracle import scheduler_adapter

    def run(
        config: dict[str, Any], requests: list[dict[str, Any]], max_steps: int
    ) -> list[StepTrace]:
        return scheduler_adapter.run(requests, max_steps, model=str(scripted_model_dir), **config)

    return run


@pytest.mark.parametrize("name", sorted(CASES))
def test_named_scenarios_match_upstream(oracle_run: Any, name: str) -> None:
    config, requests = CASES[name]
    max_steps = 300 if name.startswith("wedge") else 120
    ours = _engine_run(config, requests, max_steps)
    assert ours, "no steps ran"
    assert _first_divergence(ours, oracle_run(config, requests, max_steps)) is None


def test_random_workloads_match_upstream(oracle_run: Any) -> None:
    rng = random.Random(20240532)
    for index in range(60):
        config, requests = _random_case(rng)
        divergence = _first_divergence(
            _engine_run(config, requests, 200), oracle_run(config, requests, 200)
        )
        assert divergence is None, f"case {index} {config} {requests}: {divergence}"
