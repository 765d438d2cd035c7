"""Random scheduler-tier workloads for the differential property test.

``workloads()`` draws a whole ``Scenario``: 1-8 requests (prompt lengths 1-80, some sharing a
prefix of one or two blocks or an odd length), max_tokens, min_tokens, ignore_eos,
stop_token_ids, priorities and arrival steps; block_size 16 or 32; num_blocks from below
"barely enough" for the largest request (wedges are fine: both sides must wedge identically)
to plenty for all of them; token budgets down to max_num_seqs; max_num_seqs 1-8; fcfs or
priority; prefix caching on or off; sometimes chunked prefill off or a long-prefill threshold.

Prompt bodies come from a drawn seed (a few draws per request instead of one per token keeps
generation fast; shrinking still minimises lengths and seeds), and end in a token that drives
the script: a countdown selector or number (ends in EOS), a letter, ``" um"`` (EOS next), or a
plain byte (never EOS soon), so EOS, ``min_tokens`` and stop ids all come into play.
"""

from __future__ import annotations

import math
import random
from typing import Any

from hypothesis import strategies as st

from parity.scenario import Scenario

BOS = 389
EOS = 390
UM = 384
_BODY = [*range(256, 277), *range(356, 382), *range(1, 256)]  # numbers, letters, bytes
_ENDINGS = st.one_of(
    st.integers(424, 436),  # <|answer:M|>: counts " M-1" .. " 0", then EOS
    st.integers(256, 266),  # " n": counts down to EOS
    st.just(UM),  # EOS next
    st.integers(356, 381),  # letters: " z" -> </think> -> " 4" ...
    st.integers(1, 255),  # bytes: " (t mod 10)"
)
_STOP_IDS = st.lists(st.sampled_from([256, 257, 258, 260, EOS, UM]), max_size=2)
# Strategies are built once: constructing and validating them per draw dominates otherwise.
_BOOL = st.booleans()
_ONE_IN_FOUR = st.integers(0, 3)
_ONE_IN_FIVE = st.integers(0, 4)
_LENGTH = st.integers(0, 48)
_SEED = st.integers(0, 255)
_MAX_TOKENS = st.integers(1, 40)
_PRIORITY = st.integers(0, 3)
_AT_STEP = st.one_of(st.just(0), st.integers(0, 12))
_BLOCK_SIZE = st.sampled_from([16, 32])
_MAX_NUM_SEQS = st.integers(1, 8)
_CHUNKED = st.integers(0, 5)
_POLICY = st.sampled_from(["fcfs", "priority"])


def _body(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.choice(_BODY) for _ in range(length)]


@st.composite
def _request(draw: Any) -> dict[str, Any]:
    """One request without its id; ``shares`` says whether it starts with the shared prefix."""
    shares = draw(_BOOL)
    length = draw(_LENGTH)
    body = _body(draw(_SEED), length) + [draw(_ENDINGS)]
    max_tokens = draw(_MAX_TOKENS)
    request: dict[str, Any] = {
        "shares": shares,
        "prompt_token_ids": body,
        "max_tokens": max_tokens,
        "ignore_eos": draw(_BOOL),
    }
    if draw(_ONE_IN_FOUR) == 0:
        request["min_tokens"] = draw(st.integers(0, max_tokens))
    if draw(_ONE_IN_FOUR) == 0:
        request["stop_token_ids"] = draw(_STOP_IDS)
    priority = draw(_PRIORITY)
    if priority:
        request["priority"] = priority
    at_step = draw(_AT_STEP)
    if at_step:
        request["at_step"] = at_step
    return request


def _blocks_needed(request: dict[str, Any], max_model_len: int, block_size: int) -> int:
    length = min(len(request["prompt_token_ids"]) + request["max_tokens"], max_model_len)
    return math.ceil(length / block_size)


def _limits(requests: list[dict[str, Any]], budget: int, threshold: int) -> dict[str, int]:
    """Step bounds sized to the workload.

    Without progress, the only work is recomputing tokens below a request's high-water mark
    after a preemption, at least ``min(budget, threshold)`` tokens a step. Both targets run
    under the same bounds, so a bound that is too small could only hide a divergence beyond it,
    never invent one; small bounds keep a broken target's livelock cheap.
    """
    chunk = min(budget, threshold) if threshold else budget
    tokens = sum(len(r["prompt_token_ids"]) + r["max_tokens"] for r in requests)
    stall_steps = min(60, 10 + 2 * math.ceil(tokens / chunk))
    return {"max_steps": 100 + 2 * tokens, "stall_steps": stall_steps}


_REQUESTS = st.lists(_request(), min_size=1, max_size=8)


@st.composite
def workloads(draw: Any, scenario_id: str = "differential") -> Scenario:
    """One random scheduler-tier scenario (no ``expect:``: parity is the property)."""
    block_size = draw(_BLOCK_SIZE)
    prefix_len = draw(st.sampled_from([0, 0, block_size, 2 * block_size, 20]))
    prefix = [BOS] + _body(draw(_SEED), prefix_len) if prefix_len else []
    requests = []
    for index, draft in enumerate(draw(_REQUESTS)):  # a list shrinks by deleting requests
        head = prefix if draft.pop("shares") and prefix else [BOS]
        body = draft.pop("prompt_token_ids")
        requests.append({"id": f"r{index}", "prompt_token_ids": head + body, **draft})
    longest_prompt = max(len(r["prompt_token_ids"]) for r in requests)
    max_model_len = draw(st.integers(longest_prompt + 1, longest_prompt + 64))
    needs = [_blocks_needed(r, max_model_len, block_size) for r in requests]
    barely = max(needs) + 1  # the largest request fits alone (null block included)
    slack = draw(st.one_of(st.integers(-1, 2), st.integers(0, sum(needs))))
    max_num_seqs = draw(_MAX_NUM_SEQS)
    chunked = draw(_CHUNKED) > 0
    floor = max_num_seqs if chunked else max(max_num_seqs, max_model_len)
    budget = draw(st.one_of(st.just(8192), st.integers(floor, floor + 96)))
    config: dict[str, Any] = {
        "block_size": block_size,
        "num_gpu_blocks_override": max(2, barely + slack),
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": budget,
        "enable_chunked_prefill": chunked,
        "enable_prefix_caching": draw(_BOOL),
        "scheduling_policy": draw(_POLICY),
    }
    threshold = 0
    if draw(_ONE_IN_FIVE) == 0:
        threshold = config["long_prefill_token_threshold"] = draw(st.integers(1, max_model_len))
    return Scenario.model_validate(
        {
            "id": scenario_id,
            "description": "A random workload from the differential property test.",
            "tier": "scheduler",
            "config": config,
            "requests": requests,
            "limits": _limits(requests, budget, threshold),
        }
    )
