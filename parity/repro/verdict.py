"""Verdicts: a (leg, target) run -> its outcome class, the evidence, and the expectations met.

Classes, per request (the client outcomes of ``parity.serve.observe`` plus two):

- ``self_preemption_wedge``: a stall (``zero_byte_hang`` / ``mid_stream_stall``) where the
  metrics at the verdict say running 0, waiting >= 1, and the request preempted itself (the
  scheduler dump shows a wedged, preempted head, or ``vllm:num_preemptions`` rose during the
  leg). Upstream's mechanism: the sole running request preempts itself and breaks
  (``vllm/v1/core/sched/scheduler.py:834-848`` at the pin) and nothing ever admits it again.
- ``saturation_queueing`` (leg level): every request completed, and while they ran the
  metrics showed requests waiting while the token counter still moved.

The leg's class on a target is the most severe of its requests' classes (a crash first, then a
wedge, a stall, ...); a target that did not start has its startup outcome. Verdict latency is
the time from the last progress (last byte or token-counter change) to the stall verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from parity._codec import JsonMixin
from parity.repro.evidence import SigtermRecord, WedgeEvidence
from parity.repro.spec import Leg
from parity.results import RunSummary
from parity.scenario import Scenario
from parity.serve.observe import STALL_OUTCOMES, MetricsSnapshot, RequestObservation
from parity.serve.run import ServeRun

SEVERITY = (
    "crashed",
    "startup_refused",
    "startup_timeout",
    "self_preemption_wedge",
    "wedged",
    "zero_byte_hang",
    "mid_stream_stall",
    "disconnected",
    "timeout",
    "unfinished",
    "http_error",
    "saturation_queueing",
    "completed",
    "finished",
)


@dataclass(frozen=True, slots=True)
class RequestVerdict(JsonMixin):
    """One request copy's verdict."""

    request_id: str
    outcome: str  # parity.serve.observe.OUTCOMES (or the scheduler tier's)
    klass: str  # outcome, or self_preemption_wedge
    detail: str
    num_bytes: int = 0
    num_tokens: int = 0
    status: int | None = None
    finish_reason: str | None = None
    text: str | None = None
    reasoning: str | None = None
    error: str | None = None
    t_end_ms: float | None = None  # since its send
    t_last_progress_ms: float | None = None
    t_verdict_ms: float | None = None
    verdict_latency_s: float | None = None  # last progress -> verdict
    health_status: int | None = None  # /health at the verdict
    metrics: dict[str, Any] | None = None  # at the verdict (running, waiting, KV, ...)


@dataclass(frozen=True, slots=True)
class TargetLeg(JsonMixin):
    """One leg on one target: its class, per-request verdicts, evidence, expectations."""

    leg: str
    role: str
    tier: str
    target: str
    klass: str
    requests: tuple[RequestVerdict, ...]
    elapsed_s: float = 0.0
    startup: str = "started"  # startup outcome
    startup_error: str | None = None
    startup_numbers: dict[str, int] = field(default_factory=dict)
    startup_s: float | None = None
    max_model_len: int | None = None
    metrics_delta: dict[str, float] = field(default_factory=dict)
    max_waiting: float | None = None  # highest vllm:num_requests_waiting seen
    health_statuses: tuple[int | None, ...] = ()  # distinct /health answers during the leg
    evidence: WedgeEvidence | None = None
    sigterm: SigtermRecord | None = None
    log_tail: str = ""
    expect_failures: tuple[str, ...] = ()
    run: ServeRun | None = None  # serve tier (for the differ)
    summary: RunSummary | None = None  # scheduler tier
    wedge: str | None = None  # scheduler tier: the wedge description
    # confirmation on a fresh server (``parity.repro.run``): ``flaky`` when the first attempt's
    # timing verdict did not reproduce (this is the rerun; ``other_attempt`` is the first), else
    # ``other_attempt`` is the rerun that reproduced it
    flaky: bool = False
    other_attempt: TargetLeg | None = None

    @property
    def verdict_latency_s(self) -> float | None:
        values = [r.verdict_latency_s for r in self.requests if r.verdict_latency_s is not None]
        return max(values) if values else None


# classes a slow moment on a busy machine can give as well as a real defect: a leg that fails
# an expectation on one of them, or is the one target of a leg that did not exit on SIGTERM,
# is rerun once on a fresh server before it counts (``parity.repro.run``)
TIMING_CLASSES = frozenset(
    {*STALL_OUTCOMES, "self_preemption_wedge", "wedged", "timeout", "startup_timeout",
     "saturation_queueing"}
)  # fmt: skip


def needs_confirming(leg: Leg, result: TargetLeg, others: list[TargetLeg]) -> bool:
    """Whether ``result`` (a serve-tier leg on one target; ``others``: the leg on the other
    targets) is a timing verdict that must be seen twice: an unmet expectation on a timing
    class or on SIGTERM, or (no SIGTERM expectation) it survived SIGTERM where another target
    exited."""
    if leg.tier != "serve" or result.startup != "started":
        return False
    entry = leg.expectation(result.target)
    if result.expect_failures and entry is not None:
        wanted = {entry.outcome, *entry.requests.values()} - {None}
        got = {result.klass} | {v.klass for v in result.requests}
        if (wanted | got) & TIMING_CLASSES:
            return True
        term = result.sigterm.label if result.sigterm else "not sent"
        if entry.sigterm is not None and term != entry.sigterm:
            return True
    if (entry is not None and entry.sigterm is not None) or result.sigterm is None:
        return False
    labels = {o.sigterm.label for o in others if o.sigterm is not None}
    return result.sigterm.label == "survived" and "exited" in labels


def worst(classes: list[str]) -> str:
    rank = {name: i for i, name in enumerate(SEVERITY)}
    return min(classes, key=lambda c: rank.get(c, len(SEVERITY))) if classes else "completed"


def judge_serve(
    leg: Leg,
    scenario: Scenario,
    run: ServeRun,
    *,
    elapsed_s: float,
    evidence: WedgeEvidence | None = None,
    sigterm: SigtermRecord | None = None,
    snapshots: tuple[MetricsSnapshot, ...] = (),
) -> TargetLeg:
    """The verdict of a serve-tier leg on one target."""
    before = run.metrics_before
    single = len(run.observations) == 1
    verdicts = tuple(_request(o, before, evidence, single) for o in run.observations)
    if not run.startup.started:
        klass = run.startup.outcome
    else:
        klass = worst([v.klass for v in verdicts])
        if klass == "completed" and _saturated(snapshots):
            klass = "saturation_queueing"
    waiting = [s.waiting for s in snapshots if s.waiting is not None]
    statuses: list[int | None] = []
    for sample in run.health:
        if sample.status not in statuses:
            statuses.append(sample.status)
    troubled = klass not in ("completed", "saturation_queueing", "http_error")
    result = TargetLeg(
        leg=leg.name,
        role=leg.role,
        tier="serve",
        target=run.target,
        klass=klass,
        requests=verdicts,
        elapsed_s=round(elapsed_s, 3),
        startup=run.startup.outcome,
        startup_error=run.startup.error,
        startup_numbers=dict(run.startup.numbers),
        startup_s=run.startup.startup_s if run.startup.started else None,
        max_model_len=run.facts.max_model_len if run.facts else None,
        metrics_delta=_deltas(run),
        max_waiting=max(waiting) if waiting else None,
        health_statuses=tuple(statuses),
        evidence=evidence,
        sigterm=sigterm,
        log_tail=run.log_tail if troubled or sigterm else run.log_tail[-1500:],
        run=run,
    )
    return _with_expect(leg, result)


def judge_scheduler(leg: Leg, target: str, summary: RunSummary, *, elapsed_s: float) -> TargetLeg:
    """The verdict of a scheduler-tier leg on one target."""
    verdicts = tuple(
        RequestVerdict(
            request_id=rid,
            outcome=out.outcome,
            klass=out.outcome,
            detail=(
                f"finished {out.finish_reason} at step {out.finished_at_step}"
                if out.outcome == "finished"
                else f"{out.outcome}; {out.num_preemptions} preemption(s)"
            ),
            num_tokens=out.num_output_tokens,
            finish_reason=out.finish_reason,
        )
        for rid, out in summary.outcomes.items()
    )
    klass = "startup_refused" if not summary.started else worst([v.klass for v in verdicts])
    result = TargetLeg(
        leg=leg.name,
        role=leg.role,
        tier="scheduler",
        target=target,
        klass=klass,
        requests=verdicts,
        elapsed_s=round(elapsed_s, 3),
        startup="started" if summary.started else "startup_refused",
        startup_error=summary.error,
        summary=summary,
        wedge=summary.wedge.describe() if summary.wedge else None,
    )
    return _with_expect(leg, result)


def _request(
    obs: RequestObservation,
    before: MetricsSnapshot | None,
    evidence: WedgeEvidence | None,
    single: bool,
) -> RequestVerdict:
    klass = obs.outcome
    stall = obs.stall
    metrics = stall.metrics if stall is not None else None
    latency = None
    why = ""
    if stall is not None:
        latency = round((stall.t_verdict_ms - stall.t_last_progress_ms) / 1000.0, 3)
        if obs.outcome in STALL_OUTCOMES:
            preempted, why = _self_preempted(obs, metrics, before, evidence, single)
            klass = "self_preemption_wedge" if preempted else klass
    error = obs.result.error
    message = None
    if error is not None:
        message = str(error.get("message", error)).splitlines()[0][:300] if error else None
    return RequestVerdict(
        request_id=obs.request_id,
        outcome=obs.outcome,
        klass=klass,
        detail=obs.detail + (f"; self-preemption: {why}" if why else ""),
        num_bytes=obs.num_bytes,
        num_tokens=_num_tokens(obs),
        status=obs.status,
        finish_reason=obs.result.finish_reason,
        text=obs.result.text,
        reasoning=obs.result.reasoning,
        error=message,
        t_end_ms=obs.t_end_ms,
        t_last_progress_ms=stall.t_last_progress_ms if stall else obs.t_last_progress_ms,
        t_verdict_ms=stall.t_verdict_ms if stall else None,
        verdict_latency_s=latency,
        health_status=stall.health.status if stall and stall.health else None,
        metrics=metrics.summary() if metrics is not None else None,
    )


def _num_tokens(obs: RequestObservation) -> int:
    if obs.result.token_ids is not None:
        return len(obs.result.token_ids)
    usage = obs.result.usage or {}
    value = usage.get("completion_tokens")
    return int(value) if isinstance(value, int) else obs.result.num_token_frames


def _self_preempted(
    obs: RequestObservation,
    metrics: MetricsSnapshot | None,
    before: MetricsSnapshot | None,
    evidence: WedgeEvidence | None,
    single: bool,
) -> tuple[bool, str]:
    """Did the stalled request preempt itself? Needs running 0 and waiting >= 1 at the verdict,
    then any of: the scheduler dump shows a wedged preempted head; ``vllm:num_preemptions``
    rose; or (inferred) the request had run, i.e. it produced tokens (streamed, or, when it is
    the leg's only request, the token counter rose since the leg began), and now waits with
    nothing running, so it was preempted while it was the only one running. Upstream's
    preemption counter may not move at all (stats are only emitted on steps with output)."""
    if metrics is None or metrics.running != 0 or (metrics.waiting or 0) < 1:
        return False, ""
    if evidence is not None and evidence.preempted_itself:
        return True, "the scheduler dump shows it preempted and unschedulable"
    now, then = metrics.num_preemptions, before.num_preemptions if before else None
    if now is not None and now - (then or 0.0) >= 1:
        return True, "vllm:num_preemptions rose"
    if obs.num_bytes and _num_tokens(obs):
        return True, "inferred: it streamed tokens, then waits with nothing running"
    gen_now, gen_then = metrics.generation_tokens, before.generation_tokens if before else None
    if single and gen_now is not None and gen_then is not None and gen_now > gen_then:
        return True, (
            f"inferred: the token counter rose by {gen_now - gen_then:g} for it, "
            "then it waits with nothing running"
        )
    return False, ""


def _saturated(snapshots: tuple[MetricsSnapshot, ...]) -> bool:
    """Requests waited while tokens still flowed (the counter moved across a waiting sample)."""
    for prev, cur in zip(snapshots, snapshots[1:], strict=False):
        flowing = (cur.generation_tokens or 0) > (prev.generation_tokens or 0)
        if flowing and ((prev.waiting or 0) > 0 or (cur.waiting or 0) > 0):
            return True
    return False


def _deltas(run: ServeRun) -> dict[str, float]:
    before, after = run.metrics_before, run.metrics_after
    if before is None or after is None:
        return {}
    found: dict[str, float] = {}
    for name in ("num_preemptions", "generation_tokens"):
        x, y = getattr(before, name), getattr(after, name)
        if x is not None and y is not None:
            found[name] = y - x
    return found


def _with_expect(leg: Leg, result: TargetLeg) -> TargetLeg:
    entry = leg.expectation(result.target)
    if entry is None:
        return result
    failures: list[str] = []
    if entry.outcome is not None:
        outcomes = {v.outcome for v in result.requests} | {v.klass for v in result.requests}
        every = all(entry.outcome in (v.outcome, v.klass) for v in result.requests)
        if entry.outcome != result.klass and not (every and outcomes):
            failures.append(f"expected {entry.outcome}, got {result.klass}")
    for rid, want in entry.requests.items():
        copies = [v for v in result.requests if v.request_id.split("#", 1)[0] == rid]
        got = sorted({v.klass for v in copies} | {v.outcome for v in copies})
        if not copies or any(want not in (v.outcome, v.klass) for v in copies):
            failures.append(f"request {rid}: expected {want}, got {', '.join(got) or 'nothing'}")
    if entry.finish_reason is not None:
        got_reasons = {v.finish_reason for v in result.requests}
        if got_reasons != {entry.finish_reason}:
            failures.append(
                f"expected finish_reason {entry.finish_reason}, got {sorted(map(str, got_reasons))}"
            )
    if entry.content is not None:
        got_content = {"null" if v.text is None else "present" for v in result.requests}
        if got_content != {entry.content}:
            failures.append(f"expected content {entry.content}, got {sorted(got_content)}")
    if entry.sigterm is not None:
        got_term = result.sigterm.label if result.sigterm else "not sent"
        if got_term != entry.sigterm:
            failures.append(f"expected SIGTERM {entry.sigterm}, got {got_term}")
    return _replace(result, expect_failures=tuple(failures))


def _replace(result: TargetLeg, **changes: Any) -> TargetLeg:
    import dataclasses

    return dataclasses.replace(result, **changes)
