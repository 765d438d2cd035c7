"""Divergence profiles on the real server (``python -m engine serve ... --divergence NAME``).

Servers come from ``parity.serve.ServerPool`` (one per config, reaped with a ``StopRecord``) and
requests go through ``parity.serve.run_serve`` (outcomes ``zero_byte_hang`` / ``mid_stream_stall``
/ ``http_error`` / ``completed``). The serve-tier wedge is the port's record at block size 32
(our CPU block size could be 16, upstream's CPU attention needs a multiple of 32): 3 blocks (2
usable, 64 slots), max_model_len 96, which upstream refuses ("estimated maximum model length is
64") and ``legacy-capacity`` accepts; a 3-token prompt then fills both blocks (62 tokens),
preempts itself at the 65th token and waits forever. Each profile is checked to change exactly
what engine/divergence.py says, against a server without it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from contract.scripted import vocab
from contract.scripted.script import expected
from parity.serve import (
    RequestObservation,
    ServeLimits,
    ServerConfig,
    ServeRequestSpec,
    ServerHandle,
    ServerPool,
    run_serve,
)
from parity.serve.differ import THINK_START

pytestmark = pytest.mark.server

STALL_S = 2.0
LIMITS = ServeLimits(startup_timeout_s=180.0, request_timeout_s=60.0, stall_s=STALL_S)
LEGACY = {"block_size": 32, "num_gpu_blocks_override": 3, "max_model_len": 96}
# Baseline for the serving-layer profiles: M 64 (the port's falsified clamp hypothesis).
SERVING = {"block_size": 32, "num_gpu_blocks_override": 16, "max_model_len": 64,
           "reasoning_parser": "deepseek_r1"}  # fmt: skip
WEDGE_PROMPT = (vocab.BOS, vocab.answer_selector(20), vocab.think_selector(3))
WEDGE_TOKENS = expected(WEDGE_PROMPT, 62, ignore_eos=True)  # 3 + 62 = 64 slots, then stuck
REASONING = ({"role": "user", "content": "<|think:3|><|answer:2|>"},)


def target(*profiles: str) -> str:
    return " ".join(["engine", *(f"--divergence {p}" for p in profiles)])


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerPool]:
    servers = ServerPool(tmp_path_factory.mktemp("divergence-servers"), grace_s=10.0)
    try:
        yield servers
    finally:
        groups = {h.process.pid for h in servers.handles if h.process is not None}
        servers.close()
        left = [p for p in psutil.pids() if _group(p) in groups]
        assert not left, f"server processes left running: {left}"


@pytest.fixture(scope="module")
def serve(pool: ServerPool, scripted_model_dir: Path) -> Callable[..., ServerHandle]:
    """``serve(profiles, **engine_args)``: the started server for that config."""

    def start(profiles: tuple[str, ...], **engine_args: Any) -> ServerHandle:
        config = ServerConfig(
            model=str(scripted_model_dir), engine_args=engine_args, served_model_name="scripted"
        )
        handle = pool.get(target(*profiles), config, startup_timeout_s=180.0)
        assert handle.startup.started, handle.startup.describe()
        return handle

    return start


def request(request_id: str, **fields: Any) -> ServeRequestSpec:
    body = {"temperature": 0.0, "return_token_ids": True, **fields.pop("body", {})}
    return ServeRequestSpec(id=request_id, body=body, **fields)


def wedge_request(request_id: str, stream: bool) -> ServeRequestSpec:
    return request(request_id, prompt_token_ids=WEDGE_PROMPT, max_tokens=90, stream=stream,
                   body={"ignore_eos": True})  # fmt: skip


@contextlib.contextmanager
def open_wedge(url: str) -> Iterator[dict[str, Any]]:
    """A streaming wedge request held open in a thread (it ends when the server goes)."""
    seen: dict[str, Any] = {"bytes": 0}
    body = wedge_request("held", True).request_body("scripted")

    def worker() -> None:
        try:
            with (
                httpx.Client(timeout=httpx.Timeout(5.0, read=60.0)) as client,
                client.stream("POST", f"{url}/v1/completions", json=body) as resp,
            ):
                seen["status"] = resp.status_code
                for chunk in resp.iter_bytes():
                    seen["bytes"] += len(chunk)
        except httpx.HTTPError as exc:
            seen["error"] = type(exc).__name__

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        thread.join(70.0)
        assert not thread.is_alive()


def debug_state(url: str) -> dict[str, Any]:
    resp = httpx.get(f"{url}/debug/scheduler", timeout=10.0)
    assert resp.status_code == 200, resp.text
    return resp.json()


def wait_wedged(url: str, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = debug_state(url)
        if state["scheduler"]["wedged"]:
            return state
        time.sleep(0.1)
    raise AssertionError(f"not wedged within {timeout} s: {state}")


def wait_log(handle: ServerHandle, text: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = handle.log_tail(10**7)
        if text in log:
            return log
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not logged within {timeout} s:\n{handle.log_tail()}")


def _group(pid: int) -> int | None:
    try:
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return None
        return os.getpgid(pid)
    except (psutil.NoSuchProcess, ProcessLookupError, PermissionError):
        return None


# ------------------------------------------------------------------------ legacy-capacity
@pytest.mark.timeout(400)
def test_legacy_capacity_starts_what_upstream_refuses(
    pool: ServerPool, serve: Callable[..., ServerHandle], scripted_model_dir: Path
) -> None:
    config = ServerConfig(model=str(scripted_model_dir), engine_args=LEGACY)
    refused = pool.get("engine", config, startup_timeout_s=180.0)
    assert refused.startup.outcome == "startup_refused", refused.startup.describe()
    assert refused.startup.numbers["estimated_max_model_len"] == 64
    assert "max seq len (96)" in (refused.startup.error or "")
    handle = serve(("legacy-capacity",), **LEGACY)
    models = httpx.get(f"{handle.url}/v1/models", timeout=10.0).json()
    assert models["data"][0]["max_model_len"] == 96
    assert "Divergence profile legacy-capacity enabled" in handle.log_tail(10**7)
    for profiles, fitted in (((), 64), (("legacy-capacity",), 96)):
        auto = serve(profiles, **{**LEGACY, "max_model_len": "auto"})
        assert auto.startup.numbers["auto_fit_max_model_len"] == fitted
        models = httpx.get(f"{auto.url}/v1/models", timeout=10.0).json()
        assert models["data"][0]["max_model_len"] == fitted
        pool.stop(auto)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_legacy_capacity_wedges(serve: Callable[..., ServerHandle], stream: bool) -> None:
    handle = serve(("legacy-capacity",), **LEGACY)
    run = run_serve(handle, [wedge_request("wedge", stream)], LIMITS)
    obs = run.observation("wedge")
    if stream:
        assert obs.outcome == "mid_stream_stall", obs.detail
        assert obs.status == 200 and not obs.done
        assert obs.result.token_ids == tuple(WEDGE_TOKENS)
    else:
        assert obs.outcome == "zero_byte_hang", obs.detail
        assert obs.num_bytes == 0 and obs.status is None
    stall = obs.stall
    assert stall is not None and stall.server_alive
    assert stall.health is not None and stall.health.status == 200  # green while wedged
    assert (stall.metrics.running, stall.metrics.waiting) == (0.0, 1.0)
    assert STALL_S * 1000 <= stall.t_verdict_ms - (obs.t_last_byte_ms or 0.0)
    assert stall.t_verdict_ms - stall.t_last_progress_ms <= (STALL_S + 3.0) * 1000


@pytest.mark.timeout(300)
def test_debug_dump_explains_the_wedge_and_sigterm_still_works(
    pool: ServerPool, serve: Callable[..., ServerHandle]
) -> None:
    """Runs last on this server: SIGTERM while wedged exits (no sigterm profile)."""
    handle = serve(("legacy-capacity",), **LEGACY)
    idle = debug_state(handle.url)
    assert not idle["scheduler"]["wedged"] and idle["divergence"] == ["legacy-capacity"]
    with open_wedge(handle.url) as seen:
        state = wait_wedged(handle.url)
        sched = state["scheduler"]
        head = sched["head_waiting"]
        assert (head["blocks_total"], head["blocks_usable"], head["blocks_free"]) == (3, 2, 2)
        assert head["num_tokens"] == 65 and not head["can_ever_fit"]
        assert "3 for 65 tokens at block size 32" in head["explanation"]
        assert "more than the 2 usable in the pool (3 blocks" in head["explanation"]
        assert (sched["num_running"], sched["num_waiting"]) == (0, 1)
        assert sched["num_preemptions"] == idle["scheduler"]["num_preemptions"] + 1  # cumulative
        (waiting,) = sched["waiting"]
        assert waiting["status"] == "PREEMPTED" and waiting["num_blocks_held"] == 0
        assert waiting["num_output_tokens"] == 62 and waiting["num_preemptions"] == 1
        assert sched["pool"]["num_usable_blocks"] == 2 and sched["pool"]["usage"] == 0.0
        assert state["external_ids"][waiting["request_id"]].startswith("cmpl-")
        assert httpx.get(f"{handle.url}/health", timeout=5.0).status_code == 200
        os.kill(handle.process.pid, signal.SIGUSR1)
        log = wait_log(handle, "scheduler state JSON: ")
        assert "can never be scheduled (wedged)" in log
        record = pool.stop(handle, grace_s=10.0)
    assert record is not None and record.sigterm_sufficed and record.exit_s < 5.0
    assert seen["bytes"] > 0


# ------------------------------------------------------------------------ abort-unservable
@pytest.mark.timeout(300)
def test_abort_unservable_errors_instead_of_wedging(
    pool: ServerPool, serve: Callable[..., ServerHandle]
) -> None:
    handle = serve(("legacy-capacity", "abort-unservable"), **LEGACY)
    follow = request("after", prompt_token_ids=(vocab.BOS, vocab.answer_selector(3)), max_tokens=8,
                     body={"ignore_eos": True})  # fmt: skip
    run = run_serve(handle, [wedge_request("plain", False)], LIMITS)
    plain = run.observation("plain")
    assert plain.outcome == "http_error" and plain.status == 500, plain.detail
    assert plain.result.error == {"message": "Internal server error", "type":
                                  "InternalServerError", "param": None, "code": 500}  # fmt: skip
    assert plain.t_end_ms is not None and plain.t_end_ms < 10_000
    run = run_serve(handle, [wedge_request("stream", True)], LIMITS)
    stream = run.observation("stream")
    assert stream.outcome == "completed" and stream.status == 200 and stream.done, stream.detail
    # As upstream's streaming generator, an error output stops the stream before its own delta
    # is sent: tokens merged into it (a slow reader) are not shown. A prefix, then.
    sent = stream.result.token_ids
    assert sent and sent == tuple(WEDGE_TOKENS[: len(sent)]), sent
    assert stream.result.error["code"] == 500 and stream.result.finish_reason is None
    assert stream.frames[-2].payload()["error"]["type"] == "InternalServerError"
    run = run_serve(handle, [follow], LIMITS)  # the engine is not wedged afterwards
    after = run.observation("after")
    assert after.outcome == "completed" and after.result.finish_reason == "length"
    assert after.result.token_ids == tuple(
        expected((vocab.BOS, vocab.answer_selector(3)), 8, ignore_eos=True)
    )
    assert debug_state(handle.url)["scheduler"]["num_waiting"] == 0
    assert "can never be scheduled" in handle.log_tail(10**7)
    assert all(sample.status == 200 for sample in run.health)
    pool.stop(handle)


# ----------------------------------------------------------- sigterm-ignored-while-wedged
@pytest.mark.timeout(300)
def test_sigterm_ignored_while_wedged(pool: ServerPool, serve: Callable[..., ServerHandle]) -> None:
    profiles = ("legacy-capacity", "sigterm-ignored-while-wedged")
    handle = serve(profiles, **LEGACY)
    with open_wedge(handle.url):
        wait_wedged(handle.url)
        record = pool.stop(handle, grace_s=4.0)
    assert record is not None and not record.sigterm_sufficed and record.exit_s >= 4.0
    assert record.returncode == -signal.SIGKILL
    assert "[shutdown] SIGTERM ignored: the engine is wedged" in handle.log_tail(10**7)
    # the same server, not wedged: SIGTERM shuts it down as upstream
    fresh = serve(profiles, **LEGACY)
    assert fresh is not handle
    ok = run_serve(fresh, [request("ok", prompt_token_ids=WEDGE_PROMPT, max_tokens=8)], LIMITS)
    assert ok.observation("ok").outcome == "completed"
    record = pool.stop(fresh, grace_s=10.0)
    assert record is not None and record.sigterm_sufficed and record.returncode == 0


# ------------------------------------------------- serving-layer profiles vs the baseline
def normalized(obs: RequestObservation) -> Any:
    """The response without what differs run to run (ids, timestamps, how a stream is cut).

    A stream's frames are merged per choice: the server's output collector joins the deltas a
    slow reader has not taken yet, so the number of frames depends on the machine's load. When
    the ``<think>`` token's delta is joined with later ones, the reasoning parser keeps the
    marker's text in the reasoning (as upstream's, ``parity.serve.differ``'s docstring), so a
    merged stream's reasoning is compared without it."""
    if not obs.frames:
        payload = json.loads(obs.body or "null")
        if isinstance(payload, dict):
            payload.pop("id", None)
            payload.pop("created", None)
        return payload
    choices: dict[int, dict[str, Any]] = {}
    rest: list[Any] = []
    for frame in obs.frames:
        payload = frame.payload() if not frame.done else "[DONE]"
        if not isinstance(payload, dict) or not payload.get("choices"):
            if isinstance(payload, dict):
                payload.pop("id", None)
                payload.pop("created", None)
            rest.append(payload)
            continue
        for choice in payload["choices"]:
            merge_delta(
                choices.setdefault(choice["index"], {}), {**choice.pop("delta", {}), **choice}
            )
    for choice in choices.values():
        for key in ("reasoning", "reasoning_content"):
            if isinstance(choice.get(key), str):
                choice[key] = unmarked(choice[key])
    return [[choices[i] for i in sorted(choices)], rest]


def unmarked(reasoning: str | None) -> str | None:
    """Streamed reasoning without the start marker a merged delta may carry."""
    return reasoning if reasoning is None else reasoning.removeprefix(THINK_START)


def merge_delta(merged: dict[str, Any], delta: dict[str, Any]) -> None:
    """Append one frame's choice to the choice so far: text joined, lists extended."""
    for key, value in delta.items():
        old = merged.get(key)
        if isinstance(value, dict):
            merge_delta(merged.setdefault(key, {}), value)
        elif isinstance(value, list):
            merged[key] = [*(old or []), *value]
        elif isinstance(value, str) and key not in ("role", "finish_reason", "stop_reason"):
            merged[key] = (old or "") + value
        elif value is not None or key not in merged:
            merged[key] = value


def rename(value: Any, old: str, new: str) -> Any:
    if isinstance(value, dict):
        return {(new if k == old else k): rename(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [rename(v, old, new) for v in value]
    return value


def max_tokens_sum(run: Any) -> float:
    name = "vllm:request_params_max_tokens_sum"
    return (run.metrics_after.value(name) or 0.0) - (run.metrics_before.value(name) or 0.0)


SERVING_REQUESTS = [
    request("over", prompt_token_ids=WEDGE_PROMPT, max_tokens=5000, body={"ignore_eos": True}),
    request(
        "over-stream",
        prompt_token_ids=WEDGE_PROMPT,
        max_tokens=5000,
        stream=True,
        body={"ignore_eos": True},
    ),  # fmt: skip
    request("between", prompt_token_ids=WEDGE_PROMPT, max_tokens=62, body={"ignore_eos": True}),
    request("small", prompt_token_ids=WEDGE_PROMPT, max_tokens=10),
    request("chat", endpoint="chat", messages=REASONING),
    request("chat-stream", endpoint="chat", messages=REASONING, stream=True),
    request("chat-budget", endpoint="chat", messages=REASONING, max_tokens=2),
]


@pytest.fixture(scope="module")
def baseline_run(pool: ServerPool, serve: Callable[..., ServerHandle]) -> Any:
    handle = serve((), **SERVING)
    run = run_serve(handle, SERVING_REQUESTS, LIMITS)
    pool.stop(handle)
    return run


@pytest.mark.timeout(400)
def test_no_max_tokens_clamp(
    pool: ServerPool, serve: Callable[..., ServerHandle], baseline_run: Any
) -> None:
    handle = serve(("no-max-tokens-clamp",), **SERVING)
    run = run_serve(handle, SERVING_REQUESTS, LIMITS)
    pool.stop(handle)
    for request_id in ("over", "over-stream"):  # upstream: 400 before any SSE byte
        base = baseline_run.observation(request_id)
        assert base.outcome == "http_error" and base.result.error["param"] == "max_tokens"
        obs = run.observation(request_id)
        assert obs.outcome == "completed", obs.detail
        assert obs.result.finish_reason == "length"  # the scheduler's cap at max_model_len
        assert obs.result.token_ids == tuple(expected(WEDGE_PROMPT, 61, ignore_eos=True))
        assert obs.stream or obs.result.usage["completion_tokens"] == 61
    for request_id in ("between", "small", "chat", "chat-stream", "chat-budget"):
        base, obs = baseline_run.observation(request_id), run.observation(request_id)
        assert base.outcome == obs.outcome == "completed", (base.detail, obs.detail)
        assert normalized(obs) == normalized(base), request_id  # same result by another route
    assert run.observation("between").result.usage["completion_tokens"] == 61
    # the request_params_max_tokens histogram sees the unclamped values: 2 x 5000 and 62 vs 61
    assert max_tokens_sum(run) - max_tokens_sum(baseline_run) == 5000 * 2 + 1


@pytest.mark.timeout(400)
def test_reasoning_content_field(
    pool: ServerPool, serve: Callable[..., ServerHandle], baseline_run: Any
) -> None:
    handle = serve(("reasoning-content-field",), **SERVING)
    run = run_serve(handle, SERVING_REQUESTS, LIMITS)
    pool.stop(handle)
    for request_id in ("chat", "chat-stream", "chat-budget"):
        base, obs = baseline_run.observation(request_id), run.observation(request_id)
        assert obs.outcome == "completed" and base.result.reasoning_key == "reasoning"
        assert obs.result.reasoning_key == "reasoning_content"
        assert unmarked(obs.result.reasoning) == unmarked(base.result.reasoning)
        assert obs.result.reasoning
        text = obs.body or "".join(frame.raw for frame in obs.frames)
        assert '"reasoning"' not in text and '"reasoning_content"' in text
        assert rename(normalized(obs), "reasoning_content", "reasoning") == normalized(base)
    budget = run.observation("chat-budget")
    assert budget.result.finish_reason == "length" and budget.result.text is None
    for request_id in ("between", "small", "over"):  # completions: untouched
        base, obs = baseline_run.observation(request_id), run.observation(request_id)
        assert normalized(obs) == normalized(base), request_id
