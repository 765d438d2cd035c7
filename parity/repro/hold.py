"""Keep a stalled request open after the observer's verdict, so the wedge stays a wedge.

``parity.serve.client.observe_request`` closes a stalled response once it has its verdict,
and closing the connection aborts the request upstream (``with_cancellation``,
``vllm/entrypoints/serve/utils/api_utils.py:51`` at the pin): the evidence taken afterwards
(the scheduler dump, a stack dump, SIGTERM while wedged) would describe an idle server.
``HoldingTransport`` wraps httpx's transport so that the consumer's cancellation never reaches
the socket: the request (up to its headers) runs in a shielded task, and each response body is
read by a background task into a queue. A consumer that leaves early (before the headers of a
zero-byte hang, or mid-body of a stalled stream) leaves the request *held*: still outstanding
on the server until ``release()``. Every held request is bounded by the client's timeouts.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx

_END = object()
BODY_KEEP = 1 << 16
_FINISH = re.compile(r'"finish_reason":\s*"(\w+)"')


@dataclass
class HeldBody:
    """One request through the transport (monotonic seconds)."""

    num_bytes: int = 0  # body bytes read in total
    ended_at: float | None = None  # the response ended (or failed)
    error: str | None = None  # how it ended (None: clean end of body)
    held: bool = False  # the consumer left before the end: the request is being held
    status: int | None = None  # the response status (None: no status line yet)
    body: bytearray = field(default_factory=bytearray)  # the first BODY_KEEP bytes

    @property
    def finish_reason(self) -> str | None:
        """The last ``finish_reason`` in the body (JSON or SSE), if any."""
        found = _FINISH.findall(self.body.decode("utf-8", "replace"))
        return found[-1] if found else None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


class _HeldStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, state: HeldBody) -> None:
        self.inner = inner
        self.state = state
        self.queue: asyncio.Queue[object] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        self.closed = False

    def start(self) -> None:
        if self.task is None:
            self.task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        try:
            async for chunk in self.inner:
                self.state.num_bytes += len(chunk)
                if len(self.state.body) < BODY_KEEP:
                    self.state.body.extend(chunk[: BODY_KEEP - len(self.state.body)])
                await self.queue.put(chunk)
        except (httpx.HTTPError, OSError) as exc:
            self.state.error = _one_line(exc)
            await self.queue.put(exc)
        finally:
            self.state.ended_at = time.monotonic()
            await self.queue.put(_END)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self.start()
        while True:
            item = await self.queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]

    async def aclose(self) -> None:
        if self.task is not None and not self.task.done():
            self.state.held = True  # the consumer gave up mid-body: keep the connection open
            return
        await self.close()

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.wait({self.task}, timeout=5.0)
        await self.inner.aclose()


class HoldingTransport(httpx.AsyncBaseTransport):
    """An ``httpx.AsyncHTTPTransport`` whose abandoned requests stay outstanding."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.states: list[HeldBody] = []
        self.tasks: list[asyncio.Task[httpx.Response]] = []
        self.streams: list[_HeldStream] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        state = HeldBody()
        self.states.append(state)
        task = asyncio.create_task(self._send(request, state))
        self.tasks.append(task)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            state.held = True  # left before the headers (a zero-byte hang): keep it going
            task.add_done_callback(self._drain)
            raise

    async def _send(self, request: httpx.Request, state: HeldBody) -> httpx.Response:
        try:
            response = await self.inner.handle_async_request(request)
        except (httpx.HTTPError, OSError) as exc:
            state.error, state.ended_at = _one_line(exc), time.monotonic()
            raise
        assert isinstance(response.stream, httpx.AsyncByteStream)
        state.status = response.status_code
        stream = _HeldStream(response.stream, state)
        self.streams.append(stream)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=stream,
            extensions=response.extensions,
            request=request,
        )

    def _drain(self, task: asyncio.Task[httpx.Response]) -> None:
        """Headers came after the consumer left: read the body in the background."""
        if task.cancelled() or task.exception() is not None:
            return
        stream = task.result().stream
        if isinstance(stream, _HeldStream):
            stream.start()

    @property
    def held(self) -> list[HeldBody]:
        """Requests being held (their consumer left) that have not ended yet."""
        return [s for s in self.states if s.held and s.ended_at is None]

    async def release(self) -> None:
        """End every held request (the server then sees the disconnects)."""
        pending = [t for t in self.tasks if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5.0)
        for stream in self.streams:
            await stream.close()

    async def aclose(self) -> None:
        await self.release()
        await self.inner.aclose()
