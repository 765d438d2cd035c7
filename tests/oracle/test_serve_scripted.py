"""The pinned vLLM server serves the scripted model, and its greedy output is the script.

One server for the whole module (startup ~25 s), started through ``python -m oracle serve`` in a
new process group and reaped with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from contract.scripted import vocab
from contract.scripted.script import expected
from oracle.launcher import oracle_env, serve_command
from parity.process import ManagedProcess, free_port

pytestmark = [pytest.mark.oracle, pytest.mark.server]

STARTUP_TIMEOUT_S = 240.0


@pytest.fixture(scope="module")
def oracle_url(scripted_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    argv = serve_command(
        scripted_model_dir,
        "--port", str(port),
        "--enforce-eager",
        "--no-async-scheduling",
        "--dtype", "float32",
        "--block-size", "32",
        "--max-model-len", "4096",
        "--served-model-name", "scripted",
        "--reasoning-parser", "deepseek_r1",
    )  # fmt: skip
    log = tmp_path_factory.mktemp("oracle-serve") / "server.log"
    proc = ManagedProcess(argv, log_path=log, env=oracle_env())
    try:
        proc.wait_healthy(f"http://127.0.0.1:{port}/health", STARTUP_TIMEOUT_S)
        yield f"http://127.0.0.1:{port}"
    finally:
        record = proc.stop(grace_s=15.0)
        assert record.returncode is not None


def _prompts() -> list[list[int]]:
    a, t = vocab.answer_selector, vocab.think_selector
    bos = vocab.BOS
    return [
        [bos, a(5)],
        [bos, a(12)],
        [bos, a(0)],
        [bos, a(20), t(3)],
        [bos, a(2), t(0)],
        [bos, a(4), t(26)],
        [bos, vocab.LOOP],
        [bos, vocab.UTF8],
        [bos, 65, 66, 67],
        [bos, a(7)] + [70 + (i % 20) for i in range(33)] + [t(2)],
        [bos] + [65 + (i % 26) for i in range(63)],
    ]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("prompt", _prompts(), ids=lambda p: f"len{len(p)}-{p[-1]}")
def test_completions_token_ids_equal_script(oracle_url: str, prompt: list[int]) -> None:
    max_tokens = 40
    body = {
        "model": "scripted",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "return_token_ids": True,
    }
    resp = httpx.post(f"{oracle_url}/v1/completions", json=body, timeout=60.0)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    want = expected(prompt, max_tokens)
    assert choice["token_ids"] == want
    assert choice["finish_reason"] == ("stop" if want and want[-1] == vocab.EOS else "length")


@pytest.mark.timeout(600)
def test_chat_reasoning_split_equals_script(oracle_url: str) -> None:
    body = {
        "model": "scripted",
        "messages": [{"role": "user", "content": "<|think:3|><|answer:2|>"}],
        "max_tokens": 200,
        "temperature": 0.0,
        "return_token_ids": True,
    }
    resp = httpx.post(f"{oracle_url}/v1/chat/completions", json=body, timeout=60.0)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    choice = data["choices"][0]
    prompt_ids = data["prompt_token_ids"]
    assert choice["token_ids"] == expected(prompt_ids, 200)
    assert choice["message"]["reasoning"] == " x y z"
    assert choice["message"]["content"] == " 1 0"
    assert choice["finish_reason"] == "stop"
    assert data["usage"]["completion_tokens"] == len(choice["token_ids"])


@pytest.mark.timeout(600)
def test_chat_truncated_reasoning_has_null_content(oracle_url: str) -> None:
    body = {
        "model": "scripted",
        "messages": [{"role": "user", "content": "<|think:3|><|answer:2|>"}],
        "max_tokens": 3,
        "temperature": 0.0,
    }
    resp = httpx.post(f"{oracle_url}/v1/chat/completions", json=body, timeout=60.0)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["message"]["content"] is None
    assert choice["message"]["reasoning"] == " x y"
    assert choice["finish_reason"] == "length"
