"""Helpers shared by the reliability tests (importable; conftest.py is not).

- ``SCALE``: the ``RELIABILITY_SCALE`` environment variable (default 1). The fuzz and load
  tests multiply their request counts by it (``RELIABILITY_SCALE=10`` is the soak run).
- ``engine_server``: one ``python -m engine serve`` through ``parity.serve.ServerPool`` (its
  own process group, bounded health wait, reaped with SIGTERM, grace, SIGKILL; the group is
  checked gone afterwards with psutil).
- ``raw_engine_server``: the same with exactly the given flags (no ``--host`` added).
- ``engine_and_oracle``: both servers on the scripted model with the same flags, for the
  differential tests (started through the session's broker when there is one);
  ``cors_answers``: what each answers to a list of CORS requests.
- ``metrics``: a ``/metrics`` snapshot (``parity.serve.observe.parse_metrics``); ``wait_idle``
  polls until running, waiting and KV usage are all back to 0 (bounded).
- ``assert_error_shape``: vLLM's error body ``{"error": {"message", "type", "param",
  "code"}}`` (``vllm/entrypoints/serve/exception_handling/error_response.py`` at the pin).
- ``sse_payloads``: the ``data:`` payloads of an SSE body, framing checked.
- ``send_completion``: one ``/v1/completions`` request from an async client, optionally closed
  after some SSE frames (a client disconnect), as a ``StreamResult``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from contract.scripted import vocab
from parity.process import ManagedProcess, free_port
from parity.serve import ServerConfig, ServerHandle, ServerPool
from parity.serve.observe import MetricsSnapshot, parse_metrics
from parity.serve.pool import group_members, wait_group_gone
from parity.serve.spec import ROOT
from parity.serve.targets import parse_target, server_env

SCALE_ENV = "RELIABILITY_SCALE"
STARTUP_TIMEOUT_S = 120.0
IDLE_TIMEOUT_S = 30.0
MODEL_NAME = "scripted"


def scale() -> int:
    """``RELIABILITY_SCALE`` (default 1; the soak run uses 10)."""
    raw = os.environ.get(SCALE_ENV, "").strip()
    try:
        value = int(raw) if raw else 1
    except ValueError:
        raise ValueError(f"{SCALE_ENV} must be a positive integer, got {raw!r}") from None
    if value < 1:
        raise ValueError(f"{SCALE_ENV} must be a positive integer, got {value}")
    return value


SCALE = scale()


def scripted_config(model_dir: Path, *extra: str, **engine_args: Any) -> ServerConfig:
    """The scripted model served as ``scripted`` with vLLM engine args and extra flags."""
    return ServerConfig(
        model=str(model_dir),
        engine_args=engine_args,
        served_model_name=MODEL_NAME,
        extra_args=("--disable-uvicorn-access-log", *extra),
    )


@contextlib.contextmanager
def engine_server(
    log_dir: Path, config: ServerConfig, *, startup_timeout_s: float = STARTUP_TIMEOUT_S
) -> Iterator[ServerHandle]:
    """A started engine server; stopped (and its whole group checked gone) on exit."""
    pool = ServerPool(log_dir, grace_s=15.0)
    handle: ServerHandle | None = None
    try:
        handle = pool.get("engine", config, startup_timeout_s=startup_timeout_s)
        assert handle.startup.started, handle.startup.describe() + "\n" + handle.log_tail()
        yield handle
    finally:
        pool.close()
        if handle is not None and handle.process is not None:
            left = group_members(handle.process.pid)
            assert not left, f"processes of the server's group left running: {left}"


@contextlib.contextmanager
def engine_and_oracle(
    log_dir: Path,
    model_dir: Path,
    engine_args: dict[str, Any],
    flags: tuple[str, ...] = (),
    *,
    engine_only_flags: tuple[str, ...] = (),
    startup_timeout_s: float = 240.0,
) -> Iterator[dict[str, ServerHandle]]:
    """``{"engine": ..., "oracle": ...}``, both serving the scripted model as ``scripted`` with
    ``engine_args`` and ``flags``; stopped on exit, every group the pool started checked gone."""
    pool = ServerPool(log_dir, grace_s=15.0)

    def start(target: str) -> ServerHandle:
        extra = (*flags, *engine_only_flags) if target == "engine" else flags
        config = ServerConfig(
            model=str(model_dir),
            engine_args=engine_args,
            served_model_name=MODEL_NAME,
            extra_args=extra,
        )
        handle = pool.get(target, config, startup_timeout_s=startup_timeout_s)
        assert handle.startup.started, handle.startup.describe() + "\n" + handle.log_tail()
        return handle

    try:
        yield {target: start(target) for target in ("engine", "oracle")}
    finally:
        groups = [h.process.pid for h in pool.handles if h.process and not h.leased]
        pool.close()
        left = [pid for group in groups for pid in group_members(group)]
        assert not left, f"server processes left running: {left}"


def cors_answers(
    servers: dict[str, ServerHandle], requests: list[tuple[str, str, dict[str, str]]]
) -> dict[str, list[tuple[int, str, dict[str, str]]]]:
    """Each server's answers to ``(method, path, headers)``: the status, the body (preflights
    only: a GET's body is the route's own) and the ``access-control-*`` headers."""

    def answer(
        url: str, method: str, path: str, headers: dict[str, str]
    ) -> tuple[int, str, dict[str, str]]:
        response = httpx.request(method, url + path, headers=headers, timeout=60.0)
        cors = {k: v for k, v in response.headers.items() if k.startswith("access-control-")}
        body = response.text if method == "OPTIONS" else ""
        return response.status_code, body, cors

    return {
        target: [answer(handle.url, method, path, headers) for method, path, headers in requests]
        for target, handle in servers.items()
    }


def metrics(url: str, client: httpx.Client | None = None) -> MetricsSnapshot:
    """One ``/metrics`` snapshot of the server at ``url``."""
    getter = client.get if client is not None else httpx.get
    response = getter(f"{url}/metrics", timeout=10.0)
    assert response.status_code == 200, response.text[:500]
    snapshot = parse_metrics(response.text, 0.0)
    assert snapshot.error is None, snapshot.error
    return snapshot


def is_idle(snapshot: MetricsSnapshot) -> bool:
    return (
        snapshot.running == 0.0 and snapshot.waiting == 0.0 and snapshot.kv_cache_usage_perc == 0.0
    )


def wait_idle(url: str, timeout_s: float = IDLE_TIMEOUT_S) -> MetricsSnapshot:
    """Poll ``/metrics`` until nothing runs, nothing waits and no KV block is used; return the
    last snapshot (the caller asserts on it, so a timeout shows what was left)."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=10.0) as client:
        while True:
            snapshot = metrics(url, client)
            if is_idle(snapshot) or time.monotonic() >= deadline:
                return snapshot
            time.sleep(0.1)


def assert_error_shape(body: Any, status: int, where: str = "") -> dict[str, Any]:
    """vLLM's error body with ``code == status``; returns the error object."""
    assert isinstance(body, dict) and set(body) == {"error"}, f"{where}: {body!r}"[:2000]
    error = body["error"]
    assert isinstance(error, dict), f"{where}: {body!r}"[:2000]
    assert set(error) == {"message", "type", "param", "code"}, f"{where}: {error!r}"[:2000]
    assert isinstance(error["message"], str) and error["message"], f"{where}: {error!r}"
    assert isinstance(error["type"], str) and error["type"], f"{where}: {error!r}"
    assert error["param"] is None or isinstance(error["param"], str), f"{where}: {error!r}"
    assert error["code"] == status, f"{where}: code {error['code']!r} != status {status}"
    return error


def sse_payloads(text: str) -> list[str]:
    """The ``data:`` payloads of a complete SSE body, in order; the framing is asserted."""
    assert text.endswith("\n\n"), f"SSE body does not end with a blank line: {text[-300:]!r}"
    payloads = []
    for frame in text.split("\n\n")[:-1]:
        assert frame.startswith("data: "), f"not a data frame: {frame[:300]!r}"
        payloads.append(frame[len("data: ") :])
    return payloads


def stream_tokens(payloads: list[str]) -> tuple[list[int], str | None, dict[str, Any] | None]:
    """(token ids, finish_reason, error) of a completions stream's payloads (choice 0)."""
    tokens: list[int] = []
    finish: str | None = None
    error: dict[str, Any] | None = None
    for payload in payloads:
        if payload == "[DONE]":
            continue
        chunk = json.loads(payload)
        if "error" in chunk:
            error = chunk["error"]
            continue
        for choice in chunk.get("choices") or []:
            tokens.extend(choice.get("token_ids") or [])
            finish = choice.get("finish_reason") or finish
    return tokens, finish, error


def distinct_prompt(rng: Any, length: int) -> list[int]:
    """A prompt of ``length`` ordinary tokens (never a selector, BOS or EOS)."""
    return [rng.randrange(0, vocab.TOC + 1) for _ in range(length)]


@dataclass
class StreamResult:
    """What one client saw of one request (streaming or not)."""

    status: int | None = None
    frames: list[str] = field(default_factory=list)  # SSE data payloads, [DONE] included
    body: str = ""  # a non-streaming body
    error: str | None = None  # transport error
    disconnected_early: bool = False  # the client closed it on purpose

    @property
    def done(self) -> bool:
        return bool(self.frames) and self.frames[-1] == "[DONE]"

    def tokens(self) -> list[int]:
        if self.frames:
            return stream_tokens(self.frames)[0]
        return list(json.loads(self.body)["choices"][0].get("token_ids") or [])

    def finish_reason(self) -> str | None:
        if self.frames:
            return stream_tokens(self.frames)[1]
        return json.loads(self.body)["choices"][0].get("finish_reason")

    def stream_error(self) -> dict[str, Any] | None:
        return stream_tokens(self.frames)[2] if self.frames else None


async def send_completion(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    *,
    close_after_frames: int | None = None,
    progress: Any = None,
) -> StreamResult:
    """POST ``/v1/completions``; for a stream, collect the payloads (closing the connection
    after ``close_after_frames`` payloads if given). ``progress(result)`` is called after each
    payload. A transport error is recorded, not raised."""
    result = StreamResult()
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            result.status = response.status_code
            if not body.get("stream") or response.status_code != 200:
                result.body = (await response.aread()).decode("utf-8", "replace")
                return result
            if close_after_frames == 0:
                result.disconnected_early = True
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                result.frames.append(line[len("data: ") :])
                if progress is not None:
                    progress(result)
                if close_after_frames is not None and len(result.frames) >= close_after_frames:
                    result.disconnected_early = True
                    return result
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    return result


@dataclass
class RawServer:
    """An engine server started with exactly the given flags (no ``--host`` added)."""

    process: ManagedProcess
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@contextlib.contextmanager
def raw_engine_server(model_dir: Path, log_dir: Path, *flags: str) -> Iterator[RawServer]:
    """``python -m engine serve MODEL --port P *flags``: the flags as given (e.g. no ``--host``,
    to see the default bind address). Own process group, bounded health wait, reaped."""
    port = free_port()
    host = flags[flags.index("--host") + 1] if "--host" in flags else "127.0.0.1"
    argv = [sys.executable, "-m", "engine", "serve", str(model_dir), "--port", str(port), *flags]
    env = server_env(parse_target("engine"))
    process = ManagedProcess(argv, log_path=log_dir / f"raw-{port}.log", env=env, cwd=ROOT)
    try:
        process.wait_healthy(f"http://{host}:{port}/health", STARTUP_TIMEOUT_S)
        yield RawServer(process, host, port)
    finally:
        process.stop(grace_s=15.0)
        left = wait_group_gone(process.pid, 10.0)
        assert not left, f"processes of the server's group left running: {left}"
