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


def request_signatures(fixture: dict[str, Any]) -> dict[str, str]:
    return {p: s for p, s in signatures(fixture).items() if p.startswith("requests.")}


# -- max_tokens_clamp M5: 0.28.0 length-checks P + 16 before clamping, 0.32.0 clamps ---------
@pytest.mark.parametrize("name", ["clamp-completions-default", "clamp-completions-explicit"])
def test_real_clamp_refused_on_one_release_clamped_on_the_other(name: str) -> None:
    fixture = load(name)
    found = {d.path: c for d, c in classified(fixture)}
    assert {c.signature.value for c in found.values()} == {"max_tokens_clamp"}
    rules = {c.rule.split(":", 1)[0] for p, c in found.items() if p.startswith("requests.")}
    assert rules == {"M5"}
    # the refusal as recorded: a 400 naming the requested output tokens, param input_tokens
    refused = next(
        o for run in fixture["runs"] for o in run["observations"] if o["outcome"] == "http_error"
    )
    assert "output tokens" in refused["result"]["error"]["message"]
    # the same pair where the completing side stopped on its own: not the clamp
    stopped = copy.deepcopy(fixture)
    for run in stopped["runs"]:
        for item in run["observations"]:
            if item["outcome"] == "completed":
                item["result"]["finish_reason"] = "stop"
    assert "max_tokens_clamp" not in request_signatures(stopped).values()


# -- sampling: the same seed draws other tokens on another release ---------------------------
@pytest.mark.parametrize("name", ["sampling-seeded-sampling", "sampling-n-choices-seeded"])
def test_real_seeded_sampling_differs_between_releases(name: str) -> None:
    fixture = load(name)
    found = request_signatures(fixture)
    assert found and set(found.values()) == {"sampling"}
    # the same runs without a seed anywhere: nothing says the draws should have agreed
    unseeded = copy.deepcopy(fixture)
    for request in unseeded["scenario"]["requests"]:
        request.pop("seed", None)
    for run in unseeded["runs"]:
        for item in run["observations"]:
            item.get("request_body", {}).pop("seed", None)
    assert "sampling" not in request_signatures(unseeded).values()


# -- capacity_overhang: 0.28.0 counts the null block as usable --------------------------------
@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("capacity-auto-fit-n4", "C2"),
        ("capacity-startup-no-memory-n1", "C4"),
        ("capacity-startup-refused-n3-m96", "C1"),
    ],
)
def test_real_capacity_overhang(name: str, rule: str) -> None:
    fixture = load(name)
    found = classified(fixture)
    assert {c.signature.value for _, c in found} == {"capacity_overhang"}
    roots = [c.rule for d, c in found if not c.rule.startswith("F1")]
    assert roots and all(r.startswith(rule) for r in roots)
    # one block more or less than the null block apart: not the overhang
    wider = copy.deepcopy(fixture)
    wider["scenario"]["config"]["block_size"] = 7
    assert "capacity_overhang" not in signatures(wider).values()


# -- max_tokens_clamp M3 and error_shape: both refused ---------------------------------------
def test_real_prompt_of_exactly_max_model_len_is_the_clamp_refused_differently() -> None:
    fixture = load("clamp-prompt-exactly-max-model-len")
    found = classified(fixture)
    assert {c.signature.value for _, c in found} == {"max_tokens_clamp"}
    assert all("the clamp binds: M-P=0" in c.rule for _, c in found)


@pytest.mark.parametrize("name", ["error-unknown-model-404", "error-prompt-too-long-ids"])
def test_real_error_wording_is_error_shape(name: str) -> None:
    fixture = load(name)
    found = classified(fixture)
    assert {c.signature.value for _, c in found} == {"error_shape"}
    assert all(d.path.endswith("error.message") for d, _ in found)


# -- timing: a dying server's 503 seen by one side's health poll ------------------------------
def test_real_health_poll_that_caught_a_503_is_timing() -> None:
    fixture = load("timing-seeded-chunked-prefill")
    ((divergence, classification),) = classified(fixture)
    assert divergence.path == "health.statuses" and classification.signature.value == "timing"
    # a status other than 503 on one side only is not explained by poll timing
    moved = copy.deepcopy(fixture)
    moved["divergences"][0]["left"] = [200, 500]
    assert signatures(moved) == {"health.statuses": "other"}
