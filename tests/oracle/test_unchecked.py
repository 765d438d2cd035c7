"""The test-only ``oracle[unchecked]`` mode reproduces the port's wedge on upstream over HTTP.

With the startup capacity check disabled, block size 32, 2 blocks and max_model_len 2048, a
3-token prompt with max_tokens 56 streams 30 tokens and then nothing (oracle-cpu.md): the
request preempts itself and stays waiting while /health stays green.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from engine.scripted import vocab
from engine.scripted.script import expected
from oracle.launcher import oracle_env, serve_command
from parity.process import ManagedProcess, free_port

pytestmark = [pytest.mark.oracle, pytest.mark.server]


@pytest.fixture(scope="module")
def unchecked_url(
    scripted_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, ManagedProcess]]:
    port = free_port()
    argv = serve_command(
        scripted_model_dir,
        "--port", str(port),
        "--enforce-eager",
        "--no-async-scheduling",
        "--dtype", "float32",
        "--block-size", "32",
        "--num-gpu-blocks-override", "2",
        "--max-model-len", "2048",
        "--served-model-name", "scripted",
    )  # fmt: skip
    log = tmp_path_factory.mktemp("oracle-unchecked") / "server.log"
    proc = ManagedProcess(argv, log_path=log, env=oracle_env(unchecked=True))
    try:
        proc.wait_healthy(f"http://127.0.0.1:{port}/health", 240.0)
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.stop(grace_s=15.0)


@pytest.mark.timeout(600)
def test_unchecked_oracle_wedges_after_one_block(
    unchecked_url: tuple[str, ManagedProcess],
) -> None:
    url, proc = unchecked_url
    assert "oracle[unchecked]" in proc.log_tail(200_000)
    prompt = [vocab.BOS, vocab.answer_selector(20), vocab.think_selector(3)]
    body = {
        "model": "scripted",
        "prompt": prompt,
        "max_tokens": 56,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "return_token_ids": True,
    }
    tokens: list[int] = []
    last_progress = [time.monotonic()]
    stall_s = 3.0

    def read_stream() -> None:
        try:
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60.0) as resp:
                for line in resp.iter_lines():
                    if line.startswith("data: {"):
                        tokens.extend(json.loads(line[6:])["choices"][0].get("token_ids") or [])
                        last_progress[0] = time.monotonic()
        except httpx.HTTPError:
            pass

    reader = threading.Thread(target=read_stream, daemon=True)
    reader.start()
    deadline = time.monotonic() + 60.0
    while time.monotonic() - last_progress[0] < stall_s and time.monotonic() < deadline:
        time.sleep(0.1)
    # Still connected (closing would abort the request): the server is wedged.
    assert reader.is_alive()
    health = httpx.get(f"{url}/health", timeout=10.0).status_code
    metrics = httpx.get(f"{url}/metrics", timeout=10.0).text
    # The wedge: 30 tokens (one 32-token block minus the 3-token prompt, plus the token
    # sampled into the last slot), then silence while the server says it is healthy.
    assert tokens == expected(prompt, 56, ignore_eos=True)[: len(tokens)]
    assert len(tokens) == 30
    assert health == 200
    running = _gauge(metrics, "vllm:num_requests_running")
    waiting = _gauge(metrics, "vllm:num_requests_waiting")
    assert (running, waiting) == (0.0, 1.0)


def _gauge(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")
