"""The divergences of a leg between targets, each with its ``parity.signatures`` class.

Each target's serve-tier run of a leg is diffed against the first target's with
``parity.serve.differ.diff_serve_runs`` (the leg as a ``Scenario``, so locations point into the
repro file) and the divergences are classified by ``parity.causes.classify_all``:
e.g. the unmodified oracle refusing the wedge config ("estimated maximum model length is 64")
where ``engine --divergence legacy-capacity`` starts is ``capacity_overhang``.
"""

from __future__ import annotations

from dataclasses import dataclass

from parity.causes import classify_all
from parity.ledger import Finding
from parity.repro.run import ReproRun
from parity.results import Divergence
from parity.serve.differ import diff_serve_runs
from parity.signatures import Classification, SignatureContext


@dataclass(frozen=True, slots=True)
class LegDivergence:
    leg: str
    divergence: Divergence
    classification: Classification

    @property
    def signature(self) -> str:
        return self.classification.signature.value


def leg_divergences(run: ReproRun) -> list[LegDivergence]:
    """Every divergence of every serve-tier leg (each target against the first)."""
    found: list[LegDivergence] = []
    for index, leg in enumerate(run.repro.legs):
        results = [r for r in run.for_leg(leg.name) if r.run is not None]
        if leg.tier != "serve" or len(results) < 2:
            continue
        scenario = run.repro.leg_scenario(index)
        left = results[0].run
        assert left is not None
        for other in results[1:]:
            right = other.run
            assert right is not None
            context = SignatureContext.build(scenario, left, right)
            divergences = diff_serve_runs(scenario, left, right)
            for divergence, classification in zip(
                divergences, classify_all(divergences, context), strict=True
            ):
                found.append(LegDivergence(leg.name, divergence, classification))
    return found


def signatures_by_leg(found: list[LegDivergence]) -> dict[str, list[str]]:
    """Leg name -> the distinct signatures of its divergences, in order of first appearance."""
    result: dict[str, list[str]] = {}
    for item in found:
        names = result.setdefault(item.leg, [])
        if item.signature not in names:
            names.append(item.signature)
    return result


def ledger_findings(run: ReproRun, ledger_file: str = "scenarios/ledger.yaml") -> list[Finding]:
    """The decision ledger's verdict (KNOWN / NEW) on each divergence of each serve-tier leg
    (legs are judged as scenarios ``<repro id>--<leg name>``); PASS findings dropped."""
    from parity.ledger import Verdict, classify, load_ledger
    from parity.serve.suite import judge

    ledger = load_ledger(ledger_file, missing_ok=True)
    results, scenarios = [], {}
    for index, leg in enumerate(run.repro.legs):
        runs = [r.run for r in run.for_leg(leg.name) if r.run is not None]
        if leg.tier != "serve" or len(runs) < 2:
            continue
        scenario = run.repro.leg_scenario(index)
        scenarios[scenario.id] = scenario
        results.append(judge(scenario, runs))
    report = classify(results, ledger, scenarios)
    return [f for f in report.findings if f.verdict is not Verdict.PASS]
