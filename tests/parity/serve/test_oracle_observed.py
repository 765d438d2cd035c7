"""The observers against the pinned vLLM server on the scripted model (one server, reused).

Completed requests are observed with every field (frames, timings, bytes, token ids equal to
the script, usage, reasoning vs content), an over-long ``max_tokens`` is an ``http_error`` with
vLLM's error shape, the server facts and metrics are recorded, and a config upstream refuses
(bs 32, 4 blocks, M 2048) is ``startup_refused`` with its key line and numbers.
"""

from __future__ import annotations

import pytest
from serve_support import REASONING_MESSAGES, SCRIPTED_ARGS

from contract.scripted import vocab
from contract.scripted.script import expected
from parity.serve import ServeLimits, ServeRun, run_requests

pytestmark = [pytest.mark.oracle, pytest.mark.server]

LIMITS = ServeLimits(startup_timeout_s=300.0, request_timeout_s=60.0, stall_s=5.0)
PROMPT = (vocab.BOS, vocab.answer_selector(12))


@pytest.fixture(scope="module")
def oracle_run(serve_pool, scripted_config, make_request) -> ServeRun:
    """One batch of requests on the oracle (the server starts once for the module)."""
    requests = [
        make_request("stream", prompt_token_ids=PROMPT, stream=True, max_tokens=40,
                     body={"stream_options": {"include_usage": True}}),
        make_request("plain", prompt_token_ids=PROMPT, max_tokens=40),
        make_request("chat-stream", endpoint="chat", messages=REASONING_MESSAGES, stream=True,
                     max_tokens=200),
        make_request("chat", endpoint="chat", messages=REASONING_MESSAGES, max_tokens=200),
        make_request("too-long", prompt_token_ids=PROMPT, max_tokens=600),
        make_request("too-long-stream", prompt_token_ids=PROMPT, max_tokens=600, stream=True),
        make_request("many", prompt_token_ids=PROMPT, max_tokens=40, repeat=4, at_ms=200.0),
    ]  # fmt: skip
    run = run_requests(serve_pool, "oracle", scripted_config(**SCRIPTED_ARGS), requests, LIMITS)
    assert run.startup.started, run.startup.describe()
    return run


@pytest.mark.timeout(600)
def test_streaming_completion_observed_in_full(oracle_run: ServeRun) -> None:
    obs = oracle_run.observation("stream")
    want = expected(PROMPT, 40)
    assert obs.outcome == "completed", obs.detail
    assert obs.status == 200 and obs.headers["content-type"].startswith("text/event-stream")
    assert obs.result.token_ids == tuple(want)
    assert obs.result.prompt_token_ids == PROMPT
    assert obs.result.finish_reason == ("stop" if want[-1] == vocab.EOS else "length")
    assert obs.result.usage["completion_tokens"] == len(want)
    assert obs.result.text and obs.done and obs.frames[-1].done
    # token frames, then the usage frame (choices: []), then [DONE]. One frame per token
    # when the client keeps up; upstream's output collector merges the deltas a slow consumer
    # has not read yet (a busy machine), so the frames may be fewer, never more.
    assert 1 <= obs.result.num_token_frames <= len(want)
    assert obs.frames[-2].payload()["choices"] == []
    assert obs.num_bytes == sum(len(f.raw.encode()) + 2 for f in obs.frames)
    times = [obs.t_headers_ms, obs.t_first_byte_ms, obs.t_first_token_ms, obs.t_last_byte_ms]
    assert times == sorted(times) and obs.t_last_byte_ms <= obs.t_end_ms
    assert [f.t_ms for f in obs.frames] == sorted(f.t_ms for f in obs.frames)


@pytest.mark.timeout(600)
def test_non_streaming_completion_observed(oracle_run: ServeRun) -> None:
    obs = oracle_run.observation("plain")
    want = expected(PROMPT, 40)
    assert obs.outcome == "completed" and obs.status == 200 and not obs.frames
    assert obs.result.token_ids == tuple(want) and obs.result.prompt_token_ids == PROMPT
    assert obs.result.usage == {
        "prompt_tokens": 2,
        "completion_tokens": len(want),
        "total_tokens": 2 + len(want),
        **{k: v for k, v in obs.result.usage.items() if k.endswith("_details")},
    }
    assert obs.num_bytes == len(obs.body.encode()) and obs.t_first_token_ms is not None
    for copy in ("many#0", "many#1", "many#2", "many#3"):
        many = oracle_run.observation(copy)
        assert many.outcome == "completed" and many.result.token_ids == tuple(want)
        assert many.t_send_ms >= 200.0


@pytest.mark.timeout(600)
def test_reasoning_split_streaming_and_not(oracle_run: ServeRun) -> None:
    for request_id in ("chat-stream", "chat"):
        obs = oracle_run.observation(request_id)
        assert obs.outcome == "completed", obs.detail
        assert (obs.result.reasoning, obs.result.reasoning_key) == (" x y z", "reasoning")
        assert obs.result.text.strip() == "1 0" and obs.result.finish_reason == "stop"
        assert obs.result.role == "assistant"
        prompt_ids = obs.result.prompt_token_ids
        assert prompt_ids is not None and obs.result.token_ids == tuple(expected(prompt_ids, 200))


@pytest.mark.timeout(600)
def test_max_tokens_over_max_model_len_is_http_error(oracle_run: ServeRun) -> None:
    for request_id in ("too-long", "too-long-stream"):
        obs = oracle_run.observation(request_id)
        assert obs.outcome == "http_error" and obs.status == 400, obs.detail
        error = obs.result.error
        assert error["param"] == "max_tokens" and error["type"] == "BadRequestError"
        assert "max_tokens=600 cannot be greater than max_model_len=512" in error["message"]
        assert not obs.frames  # rejected before any SSE byte, even when streaming


@pytest.mark.timeout(600)
def test_target_facts_health_and_metrics(oracle_run: ServeRun) -> None:
    assert oracle_run.target == "oracle"
    assert oracle_run.facts.model_id == "scripted" and oracle_run.facts.max_model_len == 512
    assert oracle_run.health and all(h.status == 200 for h in oracle_run.health)
    before, after = oracle_run.metrics_before, oracle_run.metrics_after
    generated = sum(o.num_tokens for o in oracle_run.observations)
    assert after.generation_tokens - before.generation_tokens == generated
    assert (after.running, after.waiting) == (0.0, 0.0)
    assert oracle_run.server_alive_after and oracle_run.log_tail == ""


@pytest.mark.timeout(600)
def test_capacity_refusal_is_startup_refused(serve_pool, scripted_config, make_request) -> None:
    config = scripted_config(block_size=32, num_gpu_blocks_override=4, max_model_len=2048)
    run = run_requests(serve_pool, "oracle", config, [make_request(prompt="hi")], LIMITS)
    startup = run.startup
    assert startup.outcome == "startup_refused", startup.describe()
    assert startup.error.startswith("ValueError: To serve at least one request")
    # the null block is reserved: 3 usable blocks of 32
    assert startup.numbers["max_seq_len"] == 2048
    assert startup.numbers["estimated_max_model_len"] == 96
    assert run.outcomes == {"r1": "startup_refused"} and run.facts is None
    assert startup.returncode not in (None, 0) and "ValueError" in run.log_tail
