"""Seeded random scheduler-tier scenarios for the benchmark's differential rate.

The differential property test draws its workloads with hypothesis
(``tests/parity/parity_workloads.py``); the benchmark needs the same kind of scenario without a
test framework and reproducibly, so this draws from ``random.Random(seed)`` over similar ranges:
1-8 requests (prompt bodies of 0-48 tokens after BOS, some sharing a one- or two-block prefix,
ending in a token that drives the script: a count-down, an answer selector, ``" um"``, a letter
or a byte), max_tokens 1-40, sometimes min_tokens or stop_token_ids, priorities and arrival
steps; block size 16 or 32; KV from one block short of the largest request to plenty; token
budgets down to max_num_seqs; chunked prefill, prefix caching and the policy drawn.
No ``expect:``: the two targets agreeing is the property. Upstream: none.
"""

from __future__ import annotations

import math
import random
from typing import Any

from contract.scripted import vocab
from parity.scenario import Scenario

_BODY = (
    [vocab.number(n) for n in range(21)]
    + [vocab.LETTER_BASE + i for i in range(vocab.NUM_LETTERS)]
    + list(range(1, 256))
)
_STOP_IDS = (
    vocab.number(0),
    vocab.number(1),
    vocab.number(2),
    vocab.number(4),
    vocab.EOS,
    vocab.UM,
)


def _ending(rng: random.Random) -> int:
    kind = rng.randrange(5)
    if kind == 0:
        return vocab.answer_selector(rng.randrange(13))
    if kind == 1:
        return vocab.number(rng.randrange(11))
    if kind == 2:
        return vocab.UM
    if kind == 3:
        return vocab.LETTER_BASE + rng.randrange(vocab.NUM_LETTERS)
    return rng.randrange(1, 256)


def _request(rng: random.Random, index: int, prefix: list[int]) -> dict[str, Any]:
    head = prefix if prefix and rng.random() < 0.5 else [vocab.BOS]
    body = [rng.choice(_BODY) for _ in range(rng.randrange(49))]
    max_tokens = rng.randint(1, 40)
    request: dict[str, Any] = {
        "id": f"r{index}",
        "prompt_token_ids": head + body + [_ending(rng)],
        "max_tokens": max_tokens,
        "ignore_eos": rng.random() < 0.5,
    }
    if rng.random() < 0.25:
        request["min_tokens"] = rng.randint(0, max_tokens)
    if rng.random() < 0.25:
        request["stop_token_ids"] = rng.sample(_STOP_IDS, rng.randrange(3))
    if rng.random() < 0.5:
        request["priority"] = rng.randint(1, 3)
    if rng.random() < 0.5:
        request["at_step"] = rng.randint(1, 12)
    return request


def random_scenario(seed: int) -> Scenario:
    """One scheduler-tier scenario, the same for the same ``seed``."""
    rng = random.Random(seed)
    block_size = rng.choice((16, 32))
    prefix_len = rng.choice((0, 0, block_size, 2 * block_size, 20))
    prefix = [vocab.BOS] + [rng.choice(_BODY) for _ in range(prefix_len)] if prefix_len else []
    requests = [_request(rng, i, prefix) for i in range(rng.randint(1, 8))]
    longest = max(len(r["prompt_token_ids"]) for r in requests)
    max_model_len = rng.randint(longest + 1, longest + 64)
    needs = [
        math.ceil(min(len(r["prompt_token_ids"]) + r["max_tokens"], max_model_len) / block_size)
        for r in requests
    ]
    slack = rng.randint(-1, 2) if rng.random() < 0.5 else rng.randint(0, sum(needs))
    max_num_seqs = rng.randint(1, 8)
    chunked = rng.randrange(6) > 0
    floor = max_num_seqs if chunked else max(max_num_seqs, max_model_len)
    budget = 8192 if rng.random() < 0.5 else rng.randint(floor, floor + 96)
    config: dict[str, Any] = {
        "block_size": block_size,
        "num_gpu_blocks_override": max(2, max(needs) + 1 + slack),
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": budget,
        "enable_chunked_prefill": chunked,
        "enable_prefix_caching": rng.random() < 0.5,
        "scheduling_policy": rng.choice(("fcfs", "priority")),
    }
    tokens = sum(len(r["prompt_token_ids"]) + r["max_tokens"] for r in requests)
    chunk = budget
    if rng.randrange(5) == 0:
        threshold = config["long_prefill_token_threshold"] = rng.randint(1, max_model_len)
        chunk = min(budget, threshold)
    limits = {
        "max_steps": 100 + 2 * tokens,
        "stall_steps": min(60, 10 + 2 * math.ceil(tokens / chunk)),
    }
    return Scenario.model_validate(
        {
            "id": f"bench-differential-{seed}",
            "description": "A seeded random workload for the benchmark's differential rate.",
            "tier": "scheduler",
            "config": config,
            "requests": requests,
            "limits": limits,
        }
    )
