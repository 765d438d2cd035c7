"""Send one serve-tier request and observe it, with a stall verdict in seconds, not minutes.

A reader task streams the raw response (``Accept-Encoding: identity``, so counted bytes are
body bytes) and timestamps the headers, every chunk and every SSE event. A watchdog beside it
decides, every ``tick``, whether the request

- finished (the reader returned or failed: ``completed`` / ``http_error`` / ``disconnected`` /
  ``crashed`` when the server process is gone);
- stalled: no body byte and no change of the server's token counter for ``stall_s`` and the
  server's scheduler shows the wedge (requests waiting, none running), or no progress for
  ``CONFIRM_FACTOR`` x ``stall_s`` whatever it shows (a target without ``/metrics``, or one too
  busy to answer); then it samples ``/health`` and ``/metrics`` while the stream is still open
  and only then cancels the reader (closing the connection, which aborts the request
  upstream);
- crashed: the server process died while the request was outstanding;
- ran out of ``request_timeout_s`` while still progressing (``timeout``).

Every wait here is bounded. Upstream: the client side of vLLM's OpenAI server
(``vllm/entrypoints/openai/*/serving.py`` at the pin) and the taxonomy of docs/failure-classes.md
(guidellm's incomplete, Jepsen's indeterminate ``:info``, the socket read timeout of vLLM PR
#51030).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from parity.machine import load_now
from parity.serve.monitor import TargetMonitor
from parity.serve.observe import (
    Parsed,
    RequestObservation,
    SSEFrame,
    StallEvidence,
    frame_has_token,
    parse_body,
    parse_frames,
    split_sse,
)
from parity.serve.spec import ServeLimits, ServeRequestSpec

# A quiet request is a stall only when the server's own counters show a wedge (requests
# waiting, none running) once ``stall_s`` passed, or after CONFIRM_FACTOR x ``stall_s`` of
# silence otherwise: a non-streaming request sends nothing until it is done, and a busy machine
# can pause a server for seconds, so silence alone does not tell slow from wedged.
CONFIRM_FACTOR = 4.0
CRASH_CONFIRM_S = 1.5  # after a transport error, how long to wait for the process to exit
CANCEL_WAIT_S = 5.0


@dataclass
class _State:
    """What the reader has seen so far (monotonic seconds)."""

    send: float
    headers_at: float | None = None
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    first_byte: float | None = None
    last_byte: float | None = None
    first_token: float | None = None
    num_bytes: int = 0
    body: bytearray = field(default_factory=bytearray)
    sse: bool = False
    frames: list[SSEFrame] = field(default_factory=list)
    done: bool = False
    finished: bool = False  # the body was read to its end
    exception: str | None = None

    def ms(self, when: float | None) -> float | None:
        return None if when is None else round((when - self.send) * 1000.0, 3)


async def observe_request(
    client: httpx.AsyncClient,
    base_url: str,
    spec: ServeRequestSpec,
    request_id: str,
    *,
    model: str,
    monitor: TargetMonitor,
    limits: ServeLimits,
    tick_s: float = 0.05,
    accepts: Callable[[str], bool] | None = None,
) -> RequestObservation:
    """Send ``spec`` once (as ``request_id``) and return what was observed; ``accepts`` says
    which of the harness's own body fields the target takes (all when None)."""
    body = spec.request_body(model, accepts)
    state = _State(send=time.monotonic())
    reader = asyncio.create_task(_read(client, base_url + spec.path, body, state))
    try:
        outcome, detail, stall = await _watch(reader, state, monitor, limits, tick_s)
    except BaseException:  # cancelled (a Ctrl-C cancels the run): the read must not outlive it
        reader.cancel()
        raise
    end = time.monotonic()
    if not reader.done():
        reader.cancel()
        await asyncio.wait({reader}, timeout=CANCEL_WAIT_S)
    elif not reader.cancelled() and reader.exception() is not None:
        raise reader.exception()  # type: ignore[misc]  # a harness bug, not an outcome
    frames = tuple(state.frames)
    if state.sse:
        result = parse_frames(frames)
    elif state.finished or outcome == "http_error":
        result = parse_body(state.body.decode("utf-8", "replace"), state.status)
    else:
        result = Parsed()
    if outcome == "completed" and result.error is not None:
        message = str(result.error.get("message", result.error))
        detail = f"{detail}, with an error: {message.splitlines()[0] if message else ''}"
    elif outcome == "completed" and result.num_choices == 0:
        detail = f"{detail}, but no choices"
    first_token = state.first_token
    if first_token is None and not state.sse and result.token_ids:
        first_token = state.last_byte
    return RequestObservation(
        request_id=request_id,
        spec_id=spec.id,
        endpoint=spec.endpoint,
        stream=spec.stream,
        outcome=outcome,
        detail=detail,
        request_body=body,
        t_send_ms=monitor.ms(state.send),
        t_headers_ms=state.ms(state.headers_at),
        t_first_byte_ms=state.ms(state.first_byte),
        t_first_token_ms=state.ms(first_token),
        t_last_byte_ms=state.ms(state.last_byte),
        t_end_ms=state.ms(end),
        t_last_progress_ms=state.ms(_last_progress(state, monitor)),
        status=state.status,
        headers=state.headers,
        num_bytes=state.num_bytes,
        body=None if state.sse else state.body.decode("utf-8", "replace"),
        frames=frames,
        done=state.done,
        result=result,
        stall=stall,
        exception=state.exception,
    )


async def _read(client: httpx.AsyncClient, url: str, body: dict, state: _State) -> None:
    headers = {"accept-encoding": "identity"}
    try:
        async with client.stream("POST", url, json=body, headers=headers) as resp:
            state.headers_at = time.monotonic()
            state.status = resp.status_code
            state.headers = {k.lower(): v for k, v in resp.headers.items()}
            state.sse = "text/event-stream" in state.headers.get("content-type", "")
            async for chunk in resp.aiter_raw():
                _account(state, chunk, time.monotonic())
            if state.sse and state.body.strip():  # a trailing event without its blank line
                _account(state, b"\n\n", time.monotonic(), count=False)
            state.finished = True
    except (httpx.HTTPError, OSError) as exc:
        text = str(exc).strip().splitlines()
        state.exception = f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _account(state: _State, chunk: bytes, now: float, *, count: bool = True) -> None:
    if count and chunk:
        state.num_bytes += len(chunk)
        state.first_byte = state.first_byte or now
        state.last_byte = now
    state.body.extend(chunk)
    if not state.sse:
        return
    for raw in split_sse(state.body):
        frame = SSEFrame(t_ms=state.ms(now) or 0.0, raw=raw)
        state.frames.append(frame)
        state.done = state.done or frame.done
        if state.first_token is None and frame_has_token(frame.payload()):
            state.first_token = now


def _last_progress(state: _State, monitor: TargetMonitor) -> float:
    last = max(state.send, state.last_byte or state.send)
    if monitor.metrics_available:
        last = max(last, monitor.last_progress)
    return last


async def _watch(
    reader: asyncio.Task[None],
    state: _State,
    monitor: TargetMonitor,
    limits: ServeLimits,
    tick_s: float,
) -> tuple[str, str, StallEvidence | None]:
    deadline = state.send + limits.request_timeout_s
    while True:
        await asyncio.wait({reader}, timeout=tick_s)
        if reader.done():
            return (*await _finished(state, monitor), None)
        now = time.monotonic()
        if not monitor.alive():
            return "crashed", "the server process died while the request was outstanding", None
        last = _last_progress(state, monitor)
        quiet = now - last
        if quiet >= limits.stall_s and (
            quiet >= limits.stall_s * CONFIRM_FACTOR or monitor.scheduler_view(last) == "wedged"
        ):
            return await _stalled(state, monitor, last, now)
        if now >= deadline:
            return (
                "timeout",
                f"still progressing after request_timeout_s={limits.request_timeout_s:g}",
                None,
            )


async def _finished(state: _State, monitor: TargetMonitor) -> tuple[str, str]:
    if state.exception is None:
        if state.status is not None and state.status >= 400:
            return "http_error", f"HTTP {state.status}"
        if state.sse and not state.done:
            return "disconnected", "the stream ended without data: [DONE]"
        return "completed", f"HTTP {state.status}"
    confirm = time.monotonic() + CRASH_CONFIRM_S
    while monitor.alive() and time.monotonic() < confirm:
        await asyncio.sleep(0.05)
    if not monitor.alive():
        return "crashed", f"the server process died ({state.exception})"
    got = "no body byte" if state.num_bytes == 0 else f"{state.num_bytes} body bytes"
    return "disconnected", f"{state.exception} after {got}"


async def _stalled(
    state: _State, monitor: TargetMonitor, last: float, now: float
) -> tuple[str, str, StallEvidence]:
    health, metrics = await monitor.evidence()  # the stream is still open here
    evidence = StallEvidence(
        t_verdict_ms=state.ms(now) or 0.0,
        t_last_progress_ms=state.ms(last) or 0.0,
        health=health,
        metrics=metrics,
        server_alive=monitor.alive(),
        load=load_now(),
    )
    source = "bytes and token counter" if monitor.metrics_available else "bytes (no /metrics)"
    quiet = round(now - last, 2)
    if state.num_bytes == 0:
        head = "headers, then " if state.headers_at is not None else ""
        return (
            "zero_byte_hang",
            f"{head}no body byte; no progress ({source}) for {quiet} s",
            evidence,
        )
    detail = f"{state.num_bytes} body bytes, then no progress ({source}) for {quiet} s"
    return "mid_stream_stall", detail, evidence
