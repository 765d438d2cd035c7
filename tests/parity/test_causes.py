"""Consequence folding (parity.causes.classify_all) and the ``shutdown`` signature, on
synthetic divergences shaped like the serve differ's: what folds, into what, and the controls
that must not fold (mixed roots, non-accounting roots, non-accounted metrics)."""

from __future__ import annotations

from typing import Any

import pytest

from parity.causes import classify_all
from parity.results import Divergence
from parity.signatures import SignatureContext, classify_divergence

pytestmark = pytest.mark.timeout(30)

CONFIG = {"block_size": 32, "num_gpu_blocks_override": 16, "max_model_len": 64}
OVER = {"id": "over", "prompt_token_ids": [389, 444, 400], "max_tokens": 5000}
OK = {"id": "ok", "prompt_token_ids": [389, 444, 400], "max_tokens": 5}
SUCCESS = 'metrics_after.vllm:request_success_total{engine="0",finished_reason="length"}'
GENERATED = 'metrics_after.vllm:generation_tokens_total{engine="0"}'
RUNNING = 'metrics_after.vllm:num_requests_running{engine="0"}'


def div(path: str, left: Any, right: Any, kind: str = "response") -> Divergence:
    return Divergence(kind, path, left, right, None, "s.yaml:1", "engine", "oracle")


def context(
    *requests: dict[str, Any],
    config: dict[str, Any] | None = None,
    sides: tuple[list[Any], list[Any]] = ([], []),
) -> SignatureContext:
    """A context with the scenario's config and requests; ``sides``: each side's
    observations (``{request_id, outcome, error}`` dicts)."""
    scenario = {"config": config or CONFIG, "requests": list(requests)}
    left, right = ({"observations": items} for items in sides)
    return SignatureContext.build(scenario, left, right)


REFUSED_OVER = (
    [{"request_id": "over", "outcome": "completed", "status": 200}],
    [{"request_id": "over", "outcome": "http_error", "status": 400,
      "error": {"param": "max_tokens", "code": 400}}],
)  # fmt: skip


def signatures(divergences: list[Divergence], ctx: SignatureContext) -> list[str]:
    return [c.signature.value for c in classify_all(divergences, ctx)]


def test_metric_deltas_of_a_400_on_one_side_fold_into_max_tokens_clamp() -> None:
    found = [
        div("requests.over.outcome", "completed", "http_error", "outcome"),
        div("requests.over.status", 200, 400),
        div("requests.over.error", None, {"param": "max_tokens", "code": 400}),
        div(SUCCESS, 1, 0, "metrics"),
        div(GENERATED, 61, 0, "metrics"),
    ]
    ctx = context(OVER, sides=REFUSED_OVER)
    alone = [classify_divergence(d, ctx).signature.value for d in found]
    assert alone[3:] == ["metrics", "metrics"]  # one at a time: the symptom's class
    folded = classify_all(found, ctx)
    assert [c.signature.value for c in folded] == ["max_tokens_clamp"] * 5
    assert folded[3].rule.startswith("F2: consequence of requests.over.outcome (M3:")


def test_no_fold_when_the_request_roots_disagree() -> None:
    found = [
        div("requests.over.status", 200, 400),
        div("requests.over.error", None, {"param": "max_tokens"}),
        div("requests.ok.finish_reason", "length", "stop"),  # not a clamp (5 < 61 headroom)
        div(GENERATED, 66, 3, "metrics"),
    ]
    ctx = context(OVER, OK, sides=REFUSED_OVER)
    got = signatures(found, ctx)
    assert got[0] == "max_tokens_clamp" and got[2] != "max_tokens_clamp"
    assert got[3] == "metrics"


def test_no_fold_from_a_root_that_accounts_nothing() -> None:
    # only an error message differs: the counters cannot be its consequence
    found = [div("requests.ok.error.message", "a", "b"), div(GENERATED, 5, 4, "metrics")]
    assert signatures(found, context(OK)) == ["error_shape", "metrics"]


def test_a_gauge_is_not_folded() -> None:
    found = [
        div("requests.over.status", 200, 400),
        div("requests.over.error", None, {"param": "max_tokens"}),
        div(RUNNING, 1, 0, "metrics"),
    ]
    got = signatures(found, context(OVER, sides=REFUSED_OVER))
    assert got == ["max_tokens_clamp", "max_tokens_clamp", "metrics"]


def test_a_server_level_capacity_overhang_takes_every_consequence() -> None:
    # auto-fit advertises one block more: the chat default clamp (M - P) follows it
    found = [
        div("facts.max_model_len", 128, 96, "models"),
        div("requests.chat.usage.completion_tokens", 120, 88),
        div("requests.chat.finish_reason", "length", "stop"),
        div(GENERATED, 120, 88, "metrics"),
    ]
    chat = {"id": "chat", "endpoint": "chat", "messages": [{"role": "user", "content": "x"}]}
    ctx = context(chat, config={"block_size": 32, "num_gpu_blocks_override": 4})
    folded = classify_all(found, ctx)
    assert [c.signature.value for c in folded] == ["capacity_overhang"] * 4
    assert folded[0].rule.startswith("C2")
    assert all(c.rule.startswith("F1: consequence of facts.max_model_len") for c in folded[1:])


def test_no_server_root_no_fold_of_unrelated_request_differences() -> None:
    found = [div("requests.ok.text", "a", "b"), div("requests.ok.token_ids", [1], [2])]
    assert signatures(found, context(OK)) == ["other", "other"]


def test_shutdown_signature() -> None:
    d = div("shutdown.sigterm", "survived", "exited", "shutdown")
    result = classify_divergence(d, context(OK))
    assert result.signature.value == "shutdown" and "survived" in result.rule
    # a shutdown path is never read as a wedge, even with a wedged request in the runs
    wedged = {"observations": [{"request_id": "ok", "outcome": "zero_byte_hang"}]}
    finished = {"observations": [{"request_id": "ok", "outcome": "completed"}]}
    scenario = {"config": CONFIG, "requests": [OK]}
    both = SignatureContext.build(scenario, wedged, finished)
    assert classify_divergence(d, both).signature.value == "shutdown"
    assert classify_divergence(div("x.y", 1, 2, "shutdown")).signature.value == "shutdown"
