"""Verdict classes from hand-built runs (no server): self-preemption, saturation, expectations."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from parity.repro.spec import load_repro
from parity.repro.verdict import judge_serve
from parity.serve.observe import HealthSample, MetricsSnapshot, RequestObservation, StallEvidence
from parity.serve.pool import StartupRecord
from parity.serve.run import ServeRun

pytestmark = pytest.mark.timeout(60)

REPRO = """\
id: unit
description: unit
legs:
  - name: wedge
    role: wedge
    requests: [{id: w, prompt_token_ids: [1, 2, 3], max_tokens: 90}]
    expect: {"*": {outcome: zero_byte_hang, requests: {w: self_preemption_wedge}}}
  - name: load
    role: saturation
    requests: [{id: r, prompt_token_ids: [1, 2, 3], max_tokens: 9, repeat: 2}]
    expect: {"*": completed}
"""
M = "vllm:"


def snap(t: float, running: float, waiting: float, tokens: float, preempt: float = 0.0):
    return MetricsSnapshot(
        t,
        {
            f"{M}num_requests_running": running,
            f"{M}num_requests_waiting": waiting,
            f"{M}generation_tokens_total": tokens,
            f"{M}num_preemptions_total": preempt,
        },
    )


def stalled(metrics: MetricsSnapshot, num_bytes: int = 0) -> RequestObservation:
    evidence = StallEvidence(3000.0, 1000.0, HealthSample(3000.0, 200), metrics, True)
    return RequestObservation(
        request_id="w", spec_id="w", endpoint="completions", stream=False,
        outcome="zero_byte_hang", detail="no body byte", num_bytes=num_bytes, stall=evidence,
    )  # fmt: skip


def run_of(*observations: RequestObservation, before: MetricsSnapshot) -> ServeRun:
    return ServeRun(
        target="engine",
        startup=StartupRecord(target="engine", outcome="started"),
        observations=observations,
        metrics_before=before,
        health=(HealthSample(0.0, 200),),
    )


@pytest.fixture
def repro(tmp_path: Path) -> Callable[[], object]:
    path = tmp_path / "unit.repro.yaml"
    path.write_text(REPRO)
    return load_repro(path)


def test_zero_byte_hang_after_tokens_is_a_self_preemption_wedge(repro) -> None:
    leg, scenario = repro.legs[0], repro.leg_scenario(0)
    run = run_of(stalled(snap(3000, 0, 1, 62)), before=snap(0, 0, 0, 0))
    result = judge_serve(leg, scenario, run, elapsed_s=3.0)
    (verdict,) = result.requests
    assert (verdict.outcome, verdict.klass, result.klass) == (
        "zero_byte_hang", "self_preemption_wedge", "self_preemption_wedge",
    )  # fmt: skip
    assert verdict.verdict_latency_s == 2.0 and verdict.health_status == 200
    assert "token counter rose by 62" in verdict.detail and not result.expect_failures


def test_waiting_that_never_ran_is_not_self_preemption(repro) -> None:
    leg, scenario = repro.legs[0], repro.leg_scenario(0)
    run = run_of(stalled(snap(3000, 1, 1, 0)), before=snap(0, 0, 0, 0))  # something runs
    result = judge_serve(leg, scenario, run, elapsed_s=3.0)
    assert result.klass == "zero_byte_hang"
    assert result.expect_failures == (
        "request w: expected self_preemption_wedge, got zero_byte_hang",
    )


def test_saturation_is_waiting_while_tokens_flow(repro) -> None:
    leg, scenario = repro.legs[1], repro.leg_scenario(1)
    done = [
        RequestObservation(
            request_id=f"r#{k}",
            spec_id="r",
            endpoint="completions",
            stream=False,
            outcome="completed",
            detail="HTTP 200",
        )  # fmt: skip
        for k in range(2)
    ]
    samples = (snap(0, 0, 0, 0), snap(100, 1, 1, 5), snap(200, 1, 0, 12, 1))
    run = run_of(*done, before=samples[0])
    assert judge_serve(leg, scenario, run, elapsed_s=1.0, snapshots=samples).klass == (
        "saturation_queueing"
    )
    quiet = (snap(0, 0, 0, 0), snap(100, 2, 0, 5), snap(200, 2, 0, 12))
    result = judge_serve(leg, scenario, run, elapsed_s=1.0, snapshots=quiet)
    assert result.klass == "completed" and not result.expect_failures
