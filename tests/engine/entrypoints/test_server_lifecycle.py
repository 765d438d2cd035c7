"""Server lifecycle and security: flags, startup refusal, API key, body cap, disconnect,
SIGTERM (abort and drain)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from contract.scripted import vocab

pytestmark = [pytest.mark.server]

LOOP = [vocab.BOS, vocab.LOOP]  # " tick tock ..." forever


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "flags",
    [["--bogus-flag"], ["--max-model-len", "abc"], ["--port", "x"], ["--block-size", "0"]],
)
def test_bad_flag_is_one_line_and_exit_2(
    scripted_model_dir: Path, flags: list[str], engine_cli
) -> None:
    result = engine_cli("serve", str(scripted_model_dir), *flags)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0], result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.timeout(120)
def test_startup_refusal_prints_upstream_message(scripted_model_dir: Path, engine_cli) -> None:
    flags = ("--block-size", "16", "--num-gpu-blocks-override", "4", "--port", "1")
    result = engine_cli("serve", str(scripted_model_dir), *flags)
    assert result.returncode == 1
    log = result.stdout + result.stderr
    assert "To serve at least one request with the model's max seq len (8192)" in log
    assert "the estimated maximum model length is 48." in log
    assert "Engine core initialization failed" in log
    assert "Traceback" not in log


@pytest.mark.timeout(180)
def test_auto_fit_max_model_len(scripted_model_dir: Path, serve) -> None:
    flags = ("--block-size", "16", "--num-gpu-blocks-override", "4", "--max-model-len", "auto")
    with serve(scripted_model_dir, *flags) as server:
        card = httpx.get(f"{server.url}/v1/models").json()["data"][0]
        assert card["max_model_len"] == 48
        assert "Auto-fit max_model_len: reduced from 8192 to 48" in server.log()
        assert "CPU KV cache size: 64 tokens, Maximum concurrency for 48 tokens" in server.log()


@pytest.fixture(scope="module")
def guarded(scripted_model_dir: Path, serve_module):
    flags = ("--api-key", "s3cret", "--max-request-body-bytes", "4096", "--block-size", "32",
             "--max-model-len", "512", "--disable-log-stats")  # fmt: skip
    with serve_module(scripted_model_dir, *flags) as s:
        yield s


AUTH = {"Authorization": "Bearer s3cret"}


@pytest.mark.timeout(180)
def test_api_key_guards_v1_routes(guarded) -> None:
    url = guarded.url
    denied = httpx.get(f"{url}/v1/models")
    assert (denied.status_code, denied.json()) == (401, {"error": "Unauthorized"})
    wrong = httpx.post(
        f"{url}/v1/completions", json={"prompt": LOOP}, headers={"Authorization": "Bearer no"}
    )
    assert wrong.status_code == 401
    assert httpx.get(f"{url}/v1/models", headers=AUTH).status_code == 200
    assert httpx.get(f"{url}/health").status_code == 200
    assert httpx.get(f"{url}/metrics").status_code == 200


@pytest.mark.timeout(120)
def test_request_body_is_capped(guarded) -> None:
    big = {"prompt": "x" * 10_000, "max_tokens": 1}
    response = httpx.post(f"{guarded.url}/v1/completions", json=big, headers=AUTH)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == 413


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


@pytest.mark.timeout(120)
def test_client_disconnect_aborts_and_frees_blocks(guarded) -> None:
    body = {"prompt": LOOP, "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=guarded.url, headers=AUTH, timeout=30) as client:
        with client.stream("POST", "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            got = [next(lines) for _ in range(6)]
            assert any(line.startswith("data: ") for line in got)
            running = metric(client.get("/metrics").text, "vllm:num_requests_running")
            assert running == 1.0
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            text = client.get("/metrics").text
            if metric(text, "vllm:num_requests_running") == 0.0:
                break
            time.sleep(0.1)
        assert metric(text, "vllm:num_requests_running") == 0.0
        assert metric(text, "vllm:kv_cache_usage_perc") == 0.0
        assert metric(text, "vllm:request_success_total") >= 0  # the series exists


def stream_in_background(url: str, body: dict, frames: list[str]) -> threading.Thread:
    def run() -> None:
        try:
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        frames.append(line[len("data: ") :])
        except httpx.HTTPError as e:
            frames.append(f"<{type(e).__name__}>")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def wait_for(frames: list[str], count: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while len(frames) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(frames) >= count, frames


@pytest.mark.timeout(180)
def test_sigterm_aborts_in_flight_and_exits_promptly(scripted_model_dir: Path, serve) -> None:
    with serve(scripted_model_dir, "--disable-log-stats") as server:
        frames: list[str] = []
        body = {"prompt": LOOP, "max_tokens": 2000, "ignore_eos": True, "stream": True}
        thread = stream_in_background(server.url, body, frames)
        wait_for(frames, 5)
        start = time.monotonic()
        server.signal(15)
        assert server.proc is not None
        status = server.proc.wait(15)
        elapsed = time.monotonic() - start
        thread.join(10)
    assert status == 0
    assert elapsed < 10, elapsed
    assert frames[-1] == "[DONE]"
    last = json.loads(frames[-2])
    assert last["choices"][0]["finish_reason"] == "abort"
    assert "[shutdown] API server: stopping engine client mode=abort timeout=0s" in server.log()


@pytest.mark.timeout(180)
def test_sigterm_with_shutdown_timeout_drains(scripted_model_dir: Path, serve) -> None:
    flags = ("--shutdown-timeout", "30", "--disable-log-stats")
    with serve(scripted_model_dir, *flags) as server:
        frames: list[str] = []
        body = {
            "prompt": LOOP,
            "max_tokens": 480,  # long enough that the drain outlasts the late request
            "ignore_eos": True,
            "stream": True,
            "return_token_ids": True,
        }
        thread = stream_in_background(server.url, body, frames)
        wait_for(frames, 3)
        server.signal(15)
        time.sleep(0.2)
        late = httpx.post(
            f"{server.url}/v1/completions", json={"prompt": LOOP, "max_tokens": 5}, timeout=30
        )
        assert server.proc is not None
        status = server.proc.wait(40)
        thread.join(10)
    assert status == 0
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert sum(len(c["choices"][0]["token_ids"]) for c in chunks) == 480
    # A request that arrives while draining is answered at once with an abort.
    assert late.status_code == 200
    assert late.json()["choices"][0]["finish_reason"] == "abort"
    assert "mode=drain timeout=30s" in server.log()
