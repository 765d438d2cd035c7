"""Profile matrix at the scheduler tier: each scheduler-tier divergence profile
(engine/divergence.py) against the pinned upstream scheduler, over every scheduler scenario.

The differ must flag the profile where it changes behaviour, with the profile's signature and
nothing unrelated, show parity everywhere else, and the ledger must call the findings KNOWN with
the profile's target and NEW without its entry. ``abort-unservable`` turns the port's wedge
(port-wedge-bs16) into an error at step 47; ``legacy-capacity`` changes auto-fit only
(port-wedge-auto-fit: 64 instead of 48, so the request outgrows the pool and wedges). The
scheduler tier sees no startup check and no max_model_len, so what it observes of
legacy-capacity is the wedge (self_preemption_wedge); the serve tier sees the capacity overhang
itself (tests/parity/serve/test_serve_profile_matrix.py: all five profiles).

The engine target is ``engine:<model> --divergence <profile>``, as ``parity run --target``
takes it (parity/targets/engine.py: ``configure_flags``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from parity_helpers import SCENARIOS

from contract.profiles import PROFILES
from parity.causes import classify_all
from parity.ledger import Ledger, Verdict, classify, load_ledger
from parity.loader import load_scenarios
from parity.results import Status
from parity.runner import run_scenario
from parity.signatures import SignatureContext
from parity.targets import make_target

pytestmark = [pytest.mark.oracle, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
# profile -> (the scenario it changes, the signature the differ must give)
MATRIX = {
    "abort-unservable": ("port-wedge-bs16", "self_preemption_wedge"),
    "legacy-capacity": ("port-wedge-auto-fit", "self_preemption_wedge"),
}


def _without_profile(ledger: Ledger, profile: str) -> Ledger:
    """The ledger without the entries scoped to ``profile``'s targets."""
    kept = [
        (entry, line)
        for entry, line in zip(ledger.entries, ledger.lines, strict=True)
        if profile not in entry.match.target
    ]
    return Ledger(ledger.file, tuple(e for e, _ in kept), tuple(line for _, line in kept))


@pytest.mark.parametrize("profile", list(MATRIX))
def test_profile_is_caught_with_its_signature_and_nothing_else(
    profile: str, scripted_model_dir: Path, oracle_target: Any
) -> None:
    assert "scheduler" in PROFILES[profile].tiers
    changed, signature = MATRIX[profile]
    engine = make_target(f"engine:{scripted_model_dir} --divergence {profile}")
    assert engine.name == f"engine --divergence {profile}"
    scenarios = {s.id: s for s in load_scenarios([SCENARIOS])}
    results = {}
    try:
        for scenario in scenarios.values():
            result, _runs = run_scenario(scenario, [oracle_target, engine])
            results[scenario.id] = result
    finally:
        engine.close()
    diverged = {sid for sid, r in results.items() if r.status is not Status.PASS}
    assert diverged == {changed}, {sid: results[sid].verdict for sid in diverged}
    result = results[changed]
    assert result.status is Status.DIVERGENCE and result.divergences
    context = SignatureContext.build(scenarios[changed], *result.runs)
    classified = classify_all(result.divergences, context)
    found = {c.signature.value for c in classified}
    assert found == {signature}, [
        (d.path, c.rule) for d, c in zip(result.divergences, classified, strict=True)
    ]
    ledger = load_ledger(ROOT / "scenarios" / "ledger.yaml")
    report = classify(list(results.values()), ledger, scenarios)
    verdicts = {f.verdict for f in report.findings if f.scenario_id == changed}
    assert verdicts == {Verdict.KNOWN}
    known = {f.entry_id for f in report.findings if f.verdict is Verdict.KNOWN}
    assert known and all(e.split(".")[0] == profile for e in known if e), known
    stale = [e.entry.id for e in report.entries if e.state.value == "stale"]
    assert not [e for e in stale if e.startswith(profile)], stale
    bare = classify(list(results.values()), _without_profile(ledger, profile), scenarios)
    assert {f.verdict for f in bare.findings if f.scenario_id == changed} == {Verdict.NEW}
