"""Load with a tiny KV cache: 64 concurrent streams x 5 rounds, preemptions forced.

The engine serves the scripted model with a KV cache sized so that only about a quarter of the
64 concurrent requests fit at their full length (``--num-gpu-blocks-override``); the rest wait
or are preempted (recomputed) while the others grow. Every request is a greedy completion with
``ignore_eos`` (so each one runs its full ``max_tokens``), mostly streamed, on a distinct prompt
(a quarter share a long prefix, so prefix-cache hits mix with preemptions). Each request is
observed by the serve-tier harness (``parity.serve.run_serve``: outcome, SSE frames, token ids,
stall verdicts) and must:

- complete (``completed`` with ``data: [DONE]``): no stall, no disconnect, no timeout;
- deliver exactly ``contract.scripted.script.expected(prompt, max_tokens, ignore_eos=True)``:
  no token lost, duplicated or reordered, through preemption and recomputation;
- finish with ``length`` and report ``usage.completion_tokens == max_tokens``.

The server's metrics must agree: ``vllm:num_preemptions_total`` grew, ``vllm:request_success
_total`` grew by the number of requests and ``vllm:generation_tokens_total`` by the number of
tokens delivered (a recomputed token is a prompt token, not a generated one), and at the end
nothing runs, nothing waits and the KV cache is empty.

Block size 32: the pinned CPU build refuses 16 ("No common block size for 16 (CPU_ATTN:
[MultipleOf(32)])"), so this configuration also runs on the oracle.

Scale: ``RELIABILITY_SCALE=N`` (environment) runs N x 5 rounds (the soak run uses 10).
"""

from __future__ import annotations

import math
import random
import time

import pytest
from reliability_support import SCALE, wait_idle

from contract.scripted import vocab
from contract.scripted.script import expected
from parity.serve import ServeLimits, ServeRequestSpec, ServerHandle, run_serve
from parity.serve.observe import MetricsSnapshot

pytestmark = [pytest.mark.server]

STREAMS = 64
ROUNDS = 5
BLOCK_SIZE = 32
MAX_TOKENS = 40
PROMPT_LEN = (6, 22)  # distinct random prompts
SHARED_PREFIX_LEN = 40  # a quarter of the requests: this prefix + a short distinct tail
FIT_FRACTION = 4  # about 1/4 of the streams fit at full length
MAX_MODEL_LEN = 256
LIMITS = ServeLimits(startup_timeout_s=120.0, request_timeout_s=120.0, stall_s=15.0)


def longest_request() -> int:
    return max(PROMPT_LEN[1], SHARED_PREFIX_LEN + 4) + MAX_TOKENS


def num_blocks() -> int:
    """Blocks for ~1/4 of the streams at full length, plus the null block."""
    per_request = math.ceil(longest_request() / BLOCK_SIZE)
    return 1 + (STREAMS // FIT_FRACTION) * per_request


def round_requests(
    round_index: int, rng: random.Random
) -> list[tuple[ServeRequestSpec, list[int]]]:
    """64 requests with distinct prompts and their expected outputs."""
    prefix = [vocab.BOS] + [rng.randrange(0, vocab.TOC + 1) for _ in range(SHARED_PREFIX_LEN - 1)]
    requests = []
    for i in range(STREAMS):
        if i % 4 == 3:
            prompt = prefix + [rng.randrange(0, vocab.TOC + 1) for _ in range(rng.randint(1, 4))]
        else:
            prompt = [rng.randrange(0, vocab.TOC + 1) for _ in range(rng.randint(*PROMPT_LEN))]
        stream = i % 8 != 0
        body = {"temperature": 0.0, "ignore_eos": True, "return_token_ids": True}
        if stream:
            body["stream_options"] = {"include_usage": True}
        spec = ServeRequestSpec(
            id=f"r{round_index}-{i}",
            prompt_token_ids=tuple(prompt),
            max_tokens=MAX_TOKENS,
            stream=stream,
            body=body,
        )
        requests.append((spec, expected(prompt, MAX_TOKENS, ignore_eos=True)))
    return requests


def counter(snapshot: MetricsSnapshot | None, name: str) -> float:
    assert snapshot is not None and snapshot.error is None, snapshot
    value = snapshot.value(name)
    assert value is not None, f"{name} missing from /metrics"
    return value


@pytest.mark.timeout(240 + 120 * SCALE)
def test_tiny_kv_load_preempts_and_loses_no_token(module_server_factory) -> None:
    blocks = num_blocks()
    with module_server_factory(
        block_size=BLOCK_SIZE, num_gpu_blocks_override=blocks, max_model_len=MAX_MODEL_LEN
    ) as server:
        run_rounds(server, ROUNDS * SCALE, blocks)


def run_rounds(server: ServerHandle, rounds: int, blocks: int) -> None:
    rng = random.Random(1234)
    first: MetricsSnapshot | None = None
    last: MetricsSnapshot | None = None
    total_requests = total_tokens = 0
    started = time.monotonic()
    for round_index in range(rounds):
        requests = round_requests(round_index, rng)
        run = run_serve(server, [spec for spec, _ in requests], LIMITS)
        first = first or run.metrics_before
        last = run.metrics_after
        bad = [o for o in run.observations if o.outcome != "completed"]
        assert not bad, (
            f"round {round_index}: {len(bad)} requests did not complete: "
            + "; ".join(f"{o.request_id} {o.outcome} ({o.detail})" for o in bad[:5])
            + "\n"
            + run.log_tail
        )
        for (spec, want), seen in zip(requests, run.observations, strict=True):
            assert seen.request_id == spec.id
            result = seen.result
            assert result.error is None, f"{spec.id}: error {result.error}"
            assert list(result.token_ids or ()) == want, (
                f"{spec.id} (stream={spec.stream}): tokens differ from the script\n"
                f"  got      {list(result.token_ids or ())}\n  expected {want}"
            )
            assert result.finish_reason == "length", (spec.id, result.finish_reason)
            usage = result.usage or {}
            assert usage.get("completion_tokens") == MAX_TOKENS, (spec.id, usage)
            if spec.stream:
                # One chunk per engine delta; a client (or event loop) that falls behind gets
                # several tokens in one chunk, as upstream's RequestOutputCollector merges
                # deltas not consumed yet (v1/engine/output_processor.py:69-79 at the pin).
                assert seen.done and 1 <= result.num_token_frames <= MAX_TOKENS, (
                    f"{spec.id}: {result.num_token_frames} token frames"
                )
        total_requests += len(requests)
        total_tokens += sum(len(want) for _, want in requests)
    elapsed = time.monotonic() - started

    idle = wait_idle(server.url)
    preemptions = counter(idle, "vllm:num_preemptions_total") - counter(
        first, "vllm:num_preemptions_total"
    )
    successes = counter(idle, "vllm:request_success_total") - counter(
        first, "vllm:request_success_total"
    )
    generated = counter(idle, "vllm:generation_tokens_total") - counter(
        first, "vllm:generation_tokens_total"
    )
    print(
        f"\ntiny-KV load: {rounds} rounds x {STREAMS} streams = {total_requests} requests, "
        f"{total_tokens} tokens in {elapsed:.1f} s; {blocks} blocks of {BLOCK_SIZE}; "
        f"{preemptions:.0f} preemptions"
    )
    assert preemptions > 0, "the tiny KV cache never forced a preemption"
    assert successes == total_requests, (successes, total_requests)
    assert generated == total_tokens, (generated, total_tokens)
    assert (idle.running, idle.waiting, idle.kv_cache_usage_perc) == (0.0, 0.0, 0.0), idle.summary()
    assert last is not None
    assert server.alive()
