"""Signature rules on recorded real divergences: each fixture under ``fixtures/real/`` is one
scenario's pair of runs from ``parity run --json`` between two upstream releases, trimmed to
the requests the rule reads (``fixtures/real/README.md`` says where each came from). The
classifier gets the recorded divergences and runs as they were, so a rule that stops matching
what real servers answer fails here."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from parity.causes import classify_all
from parity.results import Divergence
from parity.signatures import Classification, SignatureContext

pytestmark = pytest.mark.timeout(30)

REAL = Path(__file__).resolve().parent / "fixtures" / "real"


def load(name: str) -> dict[str, Any]:
    return json.loads((REAL / f"{name}.json").read_text(encoding="utf-8"))


def classified(fixture: dict[str, Any]) -> list[tuple[Divergence, Classification]]:
    divergences = [Divergence(**d) for d in fixture["divergences"]]
    left, right = fixture["runs"]
    context = SignatureContext.build(fixture["scenario"], left, right)
    return list(zip(divergences, classify_all(divergences, context), strict=True))


def signatures(fixture: dict[str, Any]) -> dict[str, str]:
    return {d.path: c.signature.value for d, c in classified(fixture)}


def observation(fixture: dict[str, Any], side: int, request_id: str) -> dict[str, Any]:
    items = fixture["runs"][side]["observations"]
    found: dict[str, Any] = next(o for o in items if o["request_id"] == request_id)
    return found


def test_every_fixture_names_its_source_and_has_divergences() -> None:
    names = sorted(p.stem for p in REAL.glob("*.json"))
    readme = (REAL / "README.md").read_text(encoding="utf-8")
    assert names
    for name in names:
        fixture = load(name)
        assert "oracle@" in fixture["_source"] and fixture["divergences"], name
        assert f"`{name}.json`" in readme, name


# -- self_preemption_wedge: 0.28.0 wedges where 0.32.0 finishes ------------------------------
def test_real_wedge_every_divergence_of_the_pair() -> None:
    fixture = load("wedge-port-wedge-auto-fit")
    found = classified(fixture)
    assert {c.signature.value for _, c in found} == {"self_preemption_wedge"}
    assert all("wedged with nothing running" in c.rule for _, c in found)
    # the same runs with a request still running at the wedge: not a self-preemption
    busy = copy.deepcopy(fixture)
    wedged = next(r for r in busy["runs"] if r.get("wedge"))
    wedged["wedge"]["running"] = ["r1"]
    assert "self_preemption_wedge" not in signatures(busy).values()


# -- prefill_chunking: 0.28.0 caps a lone long prefill at the threshold ----------------------
def test_real_prefill_chunk_capped_on_one_release_and_its_step() -> None:
    fixture = load("chunking-long-prefill-threshold")
    found = {d.path: c for d, c in classified(fixture)}
    root = "steps[10].num_scheduled_tokens.C"
    assert found[root].rule.startswith(
        "P: C prefill chunk capped at long_prefill_token_threshold 8"
    )
    assert {c.signature.value for c in found.values()} == {"prefill_chunking"}
    assert all(
        c.rule.startswith("F3: consequence of " + root) for p, c in found.items() if p != root
    )
    # without the threshold in the config nothing explains it
    unset = copy.deepcopy(fixture)
    unset["scenario"]["config"]["long_prefill_token_threshold"] = 0
    assert set(signatures(unset).values()) == {"other"}
