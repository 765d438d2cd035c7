"""Run serve-tier scenarios on several targets, one target at a time, and judge each scenario.

Each scenario is made into a ``ServePlan`` once (server config with its model folder resolved,
requests, limits). Plans are grouped by server config: for each group, each target's server
starts once (``ServerPool``; started ahead of need by ``ServeSession``), runs every scenario
of the group in file order, one target after the other (requests never reach two servers at
once), and the group's servers are stopped when it is done (an
oracle server holds ~3 GiB). Then each scenario's runs are diffed against
the first target's (``parity.serve.differ``) and checked against ``expect:``
(``parity.serve.expect``), giving one ``ScenarioResult`` (tier ``serve``, ``runs`` the
``ServeRun``s in target order) per scenario.

A target that cannot run a scenario (a config key it cannot spell, checked before its server
starts; a vLLM request extension or ``/metrics`` the scenario needs and the started server does
not accept) gets a placeholder run saying why (``ServeRun.unsupported``): it is not compared
and not checked, and is said once, never as divergences. When a run has two or more targets and
fewer than two of them can take a scenario's config, nothing would be compared, so no target
runs it (no server is started for it): every target gets the placeholder with that reason.

Verdicts: ``unsupported`` when fewer than two targets could run it; ``error`` when no target
started and the scenario does not ``expect: {startup: refused}``; ``divergence``;
``expect_failed``; else ``pass``. ``startup_failed`` says whether a
result means exit code 3 (a target failed to start when it should have).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from parity._judge import diff_and_check
from parity.machine import MachineSpeed, load_now, recent_machine_speed, side_by_side_starts
from parity.process import CANNOT_RUN
from parity.results import (
    Attempt,
    Divergence,
    ExpectFailure,
    ScenarioResult,
    Status,
    compared_verdict,
)
from parity.scenario import Scenario
from parity.serve.differ import diff_serve_runs
from parity.serve.expect import STARTUP_PATH, check_serve_expect
from parity.serve.pool import ServerPool
from parity.serve.probe import missing
from parity.serve.run import ServeRun, run_serve
from parity.serve.spec import ServeLimits, ServerConfig, ServeRequestSpec, from_scenario
from parity.serve.targets import TargetSpec, parse_targets, unsupported_reason
from parity.signatures import Signature, SignatureContext, classify_divergence
from parity.signatures.sampling import DRAWN_FIELDS, draws_unseeded

# on_event(scenario id, target label, phase): phase is "starting" (a server is starting for
# this scenario's group), "running" or "done".
EventHook = Callable[[str, str, str], None]


def config_key(config: ServerConfig) -> str:
    """A stable key of a server config (scenarios with equal keys share a server)."""
    return json.dumps(config.to_json(), sort_keys=True, default=str)


@dataclass(frozen=True)
class ServePlan:
    """A scenario made into what the serve tier runs, once: its server config (model folder
    resolved), requests and limits. The plan travels; nothing converts the scenario again."""

    scenario: Scenario
    config: ServerConfig
    requests: tuple[ServeRequestSpec, ...]
    limits: ServeLimits

    @classmethod
    def of(cls, scenario: Scenario, project: Any = None) -> ServePlan:
        config, requests, limits = from_scenario(scenario, project=project)
        return cls(scenario, config, tuple(requests), limits)

    @property
    def key(self) -> str:
        return config_key(self.config)


def group_plans(plans: Sequence[ServePlan]) -> list[list[ServePlan]]:
    """Plans grouped by server config, groups in order of first appearance."""
    groups: dict[str, list[ServePlan]] = {}
    for plan in plans:
        groups.setdefault(plan.key, []).append(plan)
    return list(groups.values())


def group_by_config(scenarios: Sequence[Scenario]) -> list[tuple[ServerConfig, list[Scenario]]]:
    """Scenarios grouped by server config, groups in order of first appearance."""
    return [
        (group[0].config, [plan.scenario for plan in group])
        for group in group_plans([ServePlan.of(s) for s in scenarios])
    ]


def run_plan(
    pool: ServerPool,
    target: TargetSpec,
    plan: ServePlan,
    *,
    startup_timeout_s: float | None = None,
    fresh: bool = False,
    share: bool | None = None,
) -> ServeRun:
    """Run one plan on one target (its server from ``pool``), or the placeholder run that says
    why the target cannot run it: a config key it cannot take (before anything starts), or a
    vLLM extension the scenario needs that the started server does not accept. ``share``:
    whether a broker's server may run it (default: ``may_share(plan)``; a group of plans on one
    server passes what holds for all of them)."""
    reason = unsupported_reason(target, plan.config)
    if reason is not None:
        return ServeRun.not_supported(target.label, reason, plan.limits)
    timeout = startup_timeout_s or plan.limits.startup_timeout_s
    handle = pool.get(
        target, plan.config, startup_timeout_s=timeout, fresh=fresh,
        share=may_share(plan) if share is None else share,
    )  # fmt: skip
    if handle.startup.started:
        reason = missing(plan.requests, plan.scenario.expect, handle.capabilities)
        if reason is not None:
            return ServeRun.not_supported(target.label, reason, plan.limits)
    return run_serve(handle, plan.requests, plan.limits)


SCRIPTED = "scripted"  # the built scripted model's name in a models folder (parity.models)


def may_share(plan: ServePlan) -> bool:
    """A server a broker lends (``parity.serve.broker``: earlier runs used it, its prefix cache
    emptied since) gives this plan what a new server would: the model is the scripted one
    (greedy in effect at any temperature it allows: docs/scripted-model.md), or every request is
    greedy or seeded. A request that samples without a seed draws from the server's own
    generator, which earlier runs have moved on (where a logits processor leaves the scripted
    model near-equal logits, the draws are confirmed on fresh servers: ``unseeded_draws``)."""
    if plan.config.model_dir.name == SCRIPTED:
        return True
    return all(
        request.body.get("temperature") == 0 or request.body.get("seed") is not None
        for request in plan.requests
    )


def not_run_reason(specs: Sequence[TargetSpec], spec: TargetSpec, plan: ServePlan) -> str | None:
    """Why ``spec`` does not run ``plan`` at all in a run of ``specs``: its own config reason
    (``unsupported_reason``), or, with two or more targets, the first other target's when
    fewer than two can take the config (a lone run would be compared with nothing). None: run
    it (a capability the started server lacks is found after it starts: ``run_plan``)."""
    own = unsupported_reason(spec, plan.config)
    if own is not None or len(specs) < 2:
        return own
    reasons = [unsupported_reason(other, plan.config) for other in specs]
    if sum(reason is None for reason in reasons) >= 2:
        return None
    return next(reason for reason in reasons if reason is not None)


def run_serve_scenarios(
    scenarios: Sequence[Scenario],
    targets: Sequence[str],
    *,
    pool: ServerPool | None = None,
    log_dir: str | Path | None = None,
    on_event: EventHook | None = None,
    project: Any = None,
) -> list[ScenarioResult]:
    """Run every scenario on every target (see the module docstring); results in input order.

    ``pool``: reuse a caller's pool (its servers are still stopped after each group); else a
    pool is made here (logs in ``log_dir``, or a temporary folder) and closed at the end."""
    session = ServeSession(scenarios, targets, pool=pool, log_dir=log_dir, project=project)
    try:
        return session.run(on_event)
    finally:
        session.close()


class ServeSession:
    """The serve tier of one run: every server it needs is known up front (one per target and
    server config, in run order), so the next ones start while the current config's scenarios
    run (``ServerPool.prestart``: every target's server of the next config, or of the next
    several where the machine starts servers side by side faster than in turn, only while
    there is memory for another). ``begin`` starts the first ones early, e.g. while the
    scheduler tier runs. How many configs ahead is measured, not assumed
    (``parity.machine.side_by_side_starts``): on a 2-core machine that gave 1.25 cores' worth,
    two oracle starts at once made the default suite slower (163 s against 122 s: 43-49 s
    each, one alone 18 s); on one that gave 1.83-1.99, faster (132-151 s against 168-181 s).
    docs/oracle-on-cpu.md has both.
    """

    def __init__(
        self,
        scenarios: Sequence[Scenario],
        targets: Sequence[str],
        *,
        pool: ServerPool | None = None,
        log_dir: str | Path | None = None,
        project: Any = None,
    ) -> None:
        self.specs = parse_targets(targets, project)  # TargetSpecError before anything starts
        self.plans = [ServePlan.of(s, project) for s in scenarios]
        self.groups = group_plans(self.plans)
        self._own = pool is None
        self.pool = pool if pool is not None else ServerPool(log_dir)
        # the servers of the run, in the order they are needed (a key the target cannot
        # spell starts nothing)
        self.jobs = [
            (spec, group)
            for group in self.groups
            for spec in self.specs
            if any(not_run_reason(self.specs, spec, plan) is None for plan in group)
        ]
        self._done = 0
        self._configs_ahead: int | None = None
        self.machine: MachineSpeed | None = None  # measured for the lookahead, if it was

    def begin(self) -> None:
        """Start the first servers of the run in the background."""
        self._prestart()

    def run(self, on_event: EventHook | None = None) -> list[ScenarioResult]:
        hook = on_event or (lambda _s, _t, _p: None)
        results: dict[str, ScenarioResult] = {}
        for group in self.groups:
            first = _run_group(self.pool, self.specs, group, hook, after_start=self._advance)
            results.update(first)
            suspects = [p for p in group if suspect(first[p.scenario.id])]
            if suspects:  # once more, on freshly started servers (stopped after the group)
                again = _run_group(self.pool, self.specs, suspects, hook, rerun=True)
                for plan in suspects:
                    sid = plan.scenario.id
                    results[sid] = confirmed(first[sid], again[sid])
        return [results[p.scenario.id] for p in self.plans]

    def close(self) -> None:
        if self._own:
            self.pool.close()

    def _advance(self, spec: TargetSpec, group: Sequence[ServePlan]) -> None:
        """The server of (spec, group) is up: start the next ones ahead of need."""
        for index in range(self._done, len(self.jobs)):
            if self.jobs[index][0] is spec and self.jobs[index][1] is group:
                self._done = index + 1
                break
        self._prestart()

    def _ahead(self) -> int:
        """How many of the run's next servers to have started: every target's server of as
        many configs as the machine starts side by side faster than in turn (measured once,
        before the first start, when the run has more than one config)."""
        if self._configs_ahead is None:
            self._configs_ahead = 1
            if len(self.groups) > 1:
                speed = recent_machine_speed()
                self._configs_ahead = side_by_side_starts(speed)
                self.machine = speed
        return self._configs_ahead * len(self.specs)

    @property
    def configs_ahead(self) -> int:
        """How many configs' servers were kept started ahead (1 until measured)."""
        return self._configs_ahead or 1

    def _prestart(self) -> None:
        for spec, group in self.jobs[self._done : self._done + self._ahead()]:
            if not room_for_a_server():
                return
            timeout = max(plan.limits.startup_timeout_s for plan in group)
            share = all(may_share(plan) for plan in group)
            self.pool.prestart(spec, group[0].config, startup_timeout_s=timeout, share=share)


SERVER_MEMORY_BYTES = 4 * 1024**3  # an oracle server holds ~3 GiB across its processes


def room_for_a_server() -> bool:
    """Enough memory is available for one more server (with a margin)."""
    import psutil

    return psutil.virtual_memory().available > 2 * SERVER_MEMORY_BYTES


def _run_group(
    pool: ServerPool,
    specs: Sequence[TargetSpec],
    group: Sequence[ServePlan],
    hook: EventHook,
    *,
    rerun: bool = False,
    after_start: Callable[[TargetSpec, Sequence[ServePlan]], None] | None = None,
) -> dict[str, ScenarioResult]:
    """Every plan of one server config on every target (each target's server started once,
    stopped at the end), judged; ``after_start(spec, group)`` once each target's server is
    up (the session then starts the next ones)."""
    runs: dict[str, list[ServeRun]] = {p.scenario.id: [] for p in group}
    elapsed: dict[str, float] = {p.scenario.id: 0.0 for p in group}
    timeout = max(plan.limits.startup_timeout_s for plan in group)
    share = all(may_share(plan) for plan in group)
    for spec in specs:
        started = False
        for plan in group:
            scenario_id = plan.scenario.id
            phase = "running" if started else "restarting" if rerun else "starting"
            hook(scenario_id, spec.label, phase)
            began = time.perf_counter()
            reason = not_run_reason(specs, spec, plan)
            if reason is not None:
                run = ServeRun.not_supported(spec.label, reason, plan.limits)
            else:
                fresh = rerun and not started
                run = run_plan(
                    pool, spec, plan, startup_timeout_s=timeout, fresh=fresh, share=share
                )
            if not started and after_start is not None:
                after_start(spec, group)
            started = started or run.unsupported is None
            runs[scenario_id].append(run)
            elapsed[scenario_id] += time.perf_counter() - began
            hook(scenario_id, spec.label, "done")
        for handle in pool.handles:
            if handle.target.label == spec.label and handle.config == group[0].config:
                pool.stop(handle)
    return {
        p.scenario.id: judge(p.scenario, runs[p.scenario.id], round(elapsed[p.scenario.id], 3))
        for p in group
    }


# -- confirm before accuse ------------------------------------------------------------------
TIMING_OUTCOMES = ("zero_byte_hang", "mid_stream_stall", "timeout")
SERVED = ("completed", "http_error")


def suspect(result: ScenarioResult) -> list[str]:
    """The differences of a result a rerun must confirm: the one-sided timing differences a
    busy machine can cause (a request that stalled or timed out on one target while the other
    served it, a server that did not answer ``/health`` within its startup bound, a ``timing``
    divergence, an ``expect: outcome`` a stall or timeout missed), and different draws of an
    unseeded sampled request (``unseeded_draws``). Empty: nothing to confirm."""
    return timing_suspects(result) + unseeded_draws(result)


def timing_suspects(result: ScenarioResult) -> list[str]:
    """The one-sided timing differences among ``suspect``'s."""
    found: list[str] = []
    for d in result.divergences:
        one_sided = d.path.endswith(".outcome") and (
            (d.left in TIMING_OUTCOMES and d.right in SERVED)
            or (d.right in TIMING_OUTCOMES and d.left in SERVED)
        )
        timed_out = d.path.startswith("startup") and any(
            isinstance(v, str) and v.startswith("startup_timeout") for v in (d.left, d.right)
        )
        if one_sided or timed_out or d.kind == "timing":
            found.append(_described(d))
    for f in result.expect_failures:
        if f.path.startswith("expect.outcome") and f.actual in TIMING_OUTCOMES:
            found.append(f"{f.target}: {f.path}: expected {f.expected}, got {f.actual}")
    return found


def unseeded_draws(result: ScenarioResult) -> list[str]:
    """Drawn fields (``DRAWN_FIELDS``: tokens, text, logprobs, finish) that differ, with no
    signature rule to explain them (``other``), for a request both targets sampled from their
    own generator (``draws_unseeded``). Each server seeds that generator once at startup and
    every unseeded request of a step draws from it, so what a request gets depends on which
    requests shared its steps: on arrival timing, not only on the server. Such a difference
    is reported only if a rerun on fresh servers gives it again, value for value
    (``confirmed``); one a rule explains (a clamp, a reasoning split) is not a draw."""
    bodies: dict[str, list[Mapping[str, Any]]] = {}
    runs: dict[str, ServeRun] = {}
    for run in result.runs:
        if isinstance(run, ServeRun):
            runs[run.target] = run
            for obs in run.observations:
                bodies.setdefault(obs.request_id, []).append(obs.request_body)
    found: list[str] = []
    for d in result.divergences:
        parts = d.path.split(".")
        if len(parts) < 3 or parts[0] != "requests" or not (set(parts[2:]) & DRAWN_FIELDS):
            continue
        seen = bodies.get(parts[1], [])
        if len(seen) < 2 or not all(draws_unseeded(body) for body in seen):
            continue
        context = SignatureContext.build(None, runs.get(d.left_target), runs.get(d.right_target))
        if classify_divergence(d, context).signature is Signature.OTHER:
            found.append(_described(d))
    return found


def _described(d: Divergence) -> str:
    return f"{d.path}: {d.left_target}={d.left} {d.right_target}={d.right}"


def confirmed(first: ScenarioResult, again: ScenarioResult) -> ScenarioResult:
    """The rerun's result, with the first attempt as evidence; ``flaky`` when the rerun does
    not reproduce the first attempt's suspects: no timing difference this time, and no
    unseeded draw that differs exactly as it did (the same path and both values)."""
    draws_first = unseeded_draws(first)
    reasons = timing_suspects(first) + draws_first
    attempt = Attempt(
        runs=tuple(run for run in first.runs if isinstance(run, ServeRun)),
        divergences=first.divergences,
        expect_failures=first.expect_failures,
        suspects=tuple(reasons),
        load=load_now(),
    )
    draws_again = set(unseeded_draws(again))
    flaky = not timing_suspects(again) and not (draws_again & set(draws_first))
    status, verdict = again.status, again.verdict
    if flaky and draws_again:  # the rerun drew otherwise again: no finding in either draw
        kept = tuple(d for d in again.divergences if _described(d) not in draws_again)
        ran = [run for run in again.runs if isinstance(run, ServeRun) and run.unsupported is None]
        described = ran[0].describe() if ran else "no targets"
        status, verdict = compared_verdict(
            kept, again.expect_failures, [run.target for run in ran], described
        )
        again = replace(again, divergences=kept)
    if flaky:
        verdict = f"flaky: {reasons[0]} on the first attempt, not on fresh servers; {verdict}"
    else:
        verdict = f"{verdict} (reproduced on fresh servers)"
    return replace(
        again,
        status=status,
        verdict=verdict,
        attempts=(attempt, *again.attempts),
        flaky=flaky,
        elapsed_s=round(first.elapsed_s + again.elapsed_s, 3),
    )


def judge(scenario: Scenario, runs: Sequence[ServeRun], elapsed_s: float = 0.0) -> ScenarioResult:
    """Diff each run against the first that ran, check ``expect:``, and give the verdict.
    Runs of targets that could not run the scenario (``ServeRun.unsupported``) are neither
    compared nor checked."""
    supported = [run for run in runs if run.unsupported is None]
    divergences, failures = diff_and_check(scenario, supported, diff_serve_runs, check_serve_expect)
    status, verdict = _verdict(scenario, runs, divergences, failures)
    return ScenarioResult(
        scenario_id=scenario.id,
        file=scenario.file,
        tier="serve",
        targets=tuple(run.target for run in runs),
        status=status,
        verdict=verdict,
        runs=tuple(runs),
        divergences=divergences,
        expect_failures=failures,
        elapsed_s=elapsed_s,
    )


def _verdict(
    scenario: Scenario,
    runs: Sequence[ServeRun],
    divergences: Sequence[Divergence],
    failures: Sequence[ExpectFailure],
) -> tuple[Status, str]:
    expected_refusal = scenario.expect is not None and scenario.expect.startup == "refused"
    unsupported = [run for run in runs if run.unsupported is not None]
    runs = [run for run in runs if run.unsupported is None]
    if unsupported and len(runs) < 2:
        if not runs and len({run.unsupported for run in unsupported}) == 1:
            return Status.UNSUPPORTED, f"unsupported: {unsupported[0].unsupported}"
        lacking = unsupported[0]
        return Status.UNSUPPORTED, f"unsupported on {lacking.target}: {lacking.unsupported}"
    if runs and not any(run.startup.started for run in runs) and not expected_refusal:
        return Status.ERROR, f"no target started: {runs[0].startup.error}"
    described = runs[0].describe() if runs else "no targets"
    return compared_verdict(divergences, failures, [run.target for run in runs], described)


def startup_failed(result: ScenarioResult) -> bool:
    """True when a target failed to start when it should have (exit code 3): no target
    started and the scenario did not expect a refusal, a startup ``expect`` failed, or a
    target's command could not be run at all (a setup error, not the server's behaviour)."""
    if result.status is Status.ERROR:
        return True
    return any(
        isinstance(run, ServeRun) and (run.startup.error or "").startswith(CANNOT_RUN)
        for run in result.runs
    ) or any(f.path == STARTUP_PATH for f in result.expect_failures)
