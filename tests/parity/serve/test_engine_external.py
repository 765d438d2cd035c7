"""The ``external:`` target proven on our own server: ``python -m engine serve {model} --port
{port}`` with the scenario's flags appended, observed like any other target."""

from __future__ import annotations

import sys

import pytest
from serve_support import REASONING_MESSAGES, SCRIPTED_ARGS

from contract.scripted import vocab
from contract.scripted.script import expected
from parity.serve import ServeLimits, run_requests

pytestmark = pytest.mark.server

TARGET = f"external:{sys.executable} -m engine serve {{model}} --port {{port}}"
LIMITS = ServeLimits(startup_timeout_s=180.0, request_timeout_s=60.0, stall_s=5.0)


@pytest.mark.timeout(400)
def test_external_engine_serves_the_script(serve_pool, scripted_config, make_request) -> None:
    prompt = (vocab.BOS, vocab.answer_selector(7), vocab.think_selector(2))
    requests = [
        make_request("stream", prompt_token_ids=prompt, stream=True, max_tokens=30),
        make_request("plain", prompt_token_ids=prompt, max_tokens=30),
        make_request("chat", endpoint="chat", messages=REASONING_MESSAGES, max_tokens=200),
        make_request("too-long", prompt_token_ids=prompt, max_tokens=600),
    ]
    config = scripted_config(**SCRIPTED_ARGS)
    run = run_requests(serve_pool, TARGET, config, requests, LIMITS)
    assert run.startup.started, run.startup.describe()
    assert run.target.startswith("external:") and "--served-model-name" in run.startup.argv
    assert run.facts.model_id == "scripted" and run.facts.max_model_len == 512
    want = tuple(expected(prompt, 30))
    for request_id in ("stream", "plain"):
        obs = run.observation(request_id)
        assert obs.outcome == "completed", obs.detail
        assert obs.result.token_ids == want
    chat = run.observation("chat")
    assert chat.outcome == "completed" and chat.result.reasoning == " x y z"
    too_long = run.observation("too-long")
    assert too_long.outcome == "http_error" and too_long.result.error["param"] == "max_tokens"
    assert all(h.status == 200 for h in run.health)
    assert serve_pool.get(TARGET, config) is serve_pool.get(TARGET, config)  # reused
