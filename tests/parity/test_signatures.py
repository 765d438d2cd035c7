"""Signature classification (parity.signatures): each class on synthetic divergences, its
negative controls, path handling, and a real scheduler-tier run (engine vs an engine that
aborts the unservable request) whose every divergence is a self-preemption wedge."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from parity.loader import load_scenario
from parity.results import Divergence
from parity.runner import run_scenario, run_target
from parity.signatures import (
    SIGNATURES,
    Signature,
    SignatureContext,
    classify_divergence,
    frame_skeleton,
    request_id_of,
    signature_of,
    split_path,
)
from parity.targets.engine import EngineTarget
from parity.targets.replay import ReplayTarget

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[2]
REFUSAL = (
    "engine refuses the config: To serve at least one request with the model's max seq len "
    "(64), (0.0 GiB KV cache is needed, which is larger than the available KV cache memory "
    "(0.0 GiB). Based on the available memory, the estimated maximum model length is {E}. "
    "Try increasing `gpu_memory_utilization` or decreasing `max_model_len`"
)


def div(path: str, left: Any, right: Any, kind: str = "request") -> Divergence:
    return Divergence(kind, path, left, right, None, "s.yaml:1", "engine", "oracle")


def ctx(
    config: dict[str, Any] | None = None,
    requests: list[dict[str, Any]] | None = None,
    left: dict[str, Any] | None = None,
    right: dict[str, Any] | None = None,
) -> SignatureContext:
    scenario = {"config": config or {}, "requests": requests or []}
    return SignatureContext.build(scenario, left, right)


def sig(d: Divergence, context: SignatureContext | None = None) -> str:
    return signature_of(d, context).value


BLOCKS_4 = {"block_size": 16, "num_gpu_blocks_override": 4}


# -- paths ---------------------------------------------------------------------------------
def test_split_path_keeps_metric_labels_and_brackets() -> None:
    assert split_path("steps[46].num_scheduled_tokens.r1") == (
        "steps",
        "[46]",
        "num_scheduled_tokens",
        "r1",
    )
    assert split_path('metrics.vllm:request_success_total{finished_reason="x.y"}') == (
        "metrics",
        'vllm:request_success_total{finished_reason="x.y"}',
    )
    assert split_path("requests['r1'].choices[0].message") == (
        "requests",
        "r1",
        "choices",
        "[0]",
        "message",
    )


def test_request_id_with_and_without_known_ids_and_prefixes() -> None:
    assert request_id_of("steps[46].num_scheduled_tokens.r1") == "r1"
    assert request_id_of("steps[46].running") is None
    assert request_id_of("serve.requests.r1.usage.completion_tokens") == "r1"
    assert request_id_of("requests.r2#3.choices[0].text", ["r1", "r2"]) == "r2#3"
    assert request_id_of("metrics.vllm:num_requests_running", ["r1"]) is None


# -- capacity_overhang ---------------------------------------------------------------------
def test_capacity_startup_refusal_with_estimate_of_n_minus_one_blocks() -> None:
    d = div("startup", "started", "refused: " + REFUSAL.format(E=48), kind="startup")
    result = classify_divergence(d, ctx({**BLOCKS_4, "max_model_len": 2048}))
    assert result.signature is Signature.CAPACITY_OVERHANG
    assert "48 = (4-1)*16" in result.rule


def test_capacity_refusal_at_exactly_n_blocks_without_an_estimate_in_the_value() -> None:
    left = {"startup": {"outcome": "started", "max_model_len": 64}}
    right = {"startup": {"outcome": "startup_refused", "error": REFUSAL.format(E=48)}}
    d = div("serve.startup.outcome", "started", "startup_refused")
    assert sig(d, ctx({**BLOCKS_4, "max_model_len": 64}, left=left, right=right)) == (
        "capacity_overhang"
    )
    # a request of that run that never got a server is the same finding
    r = div("requests.r1.outcome", "completed", "startup_refused")
    requests = [{"id": "r1", "prompt_token_ids": [1, 2, 3], "max_tokens": 8}]
    assert sig(r, ctx({**BLOCKS_4, "max_model_len": 64}, requests, left, right)) == (
        "capacity_overhang"
    )


def test_capacity_refusal_that_is_not_one_block_is_not_overhang() -> None:
    d = div("startup", "started", "refused: " + REFUSAL.format(E=32), kind="startup")
    assert sig(d, ctx({**BLOCKS_4, "max_model_len": 2048})) == "other"


def test_capacity_without_num_blocks_uses_estimate_and_advertised_length() -> None:
    left = {"outcome": "started", "max_model_len": 64}
    right = {"outcome": "refused", "error": REFUSAL.format(E=48)}
    assert sig(div("startup", left, right, kind="startup"), ctx({"block_size": 16})) == (
        "capacity_overhang"
    )
    assert sig(div("startup", left, right, kind="startup"), ctx({"block_size": 32})) == "other"


def test_capacity_single_block_is_only_the_null_block() -> None:
    text = "No available memory for the cache blocks. Try increasing gpu_memory_utilization"
    d = div("startup", "started", f"refused: {text}", kind="startup")
    assert sig(d, ctx({"block_size": 16, "num_gpu_blocks_override": 1})) == "capacity_overhang"


def test_capacity_both_refused_one_counting_the_null_block() -> None:
    # N 1: upstream has no usable block ("No available memory"); counting the null block
    # plans one block (estimate 32) and refuses max_model_len 96 on length instead
    no_memory = "ValueError: No available memory for the cache blocks. Try increasing ..."
    left = {"startup": {"outcome": "startup_refused", "error": no_memory, "numbers": {}}}
    counted = {"estimated_max_model_len": 32, "max_seq_len": 96}
    right = {"startup": {"outcome": "startup_refused", "error": REFUSAL.format(E=32),
                         "numbers": counted}}  # fmt: skip
    config = {"block_size": 32, "num_gpu_blocks_override": 1, "max_model_len": 96}
    for path, value in counted.items():
        d = div(f"startup.numbers.{path}", None, value, kind="startup")
        result = classify_divergence(d, ctx(config, left=left, right=right))
        assert result.signature is Signature.CAPACITY_OVERHANG and result.rule.startswith("C4")
    # N 3: estimates 64 (2 usable) vs 96 (all 3)
    usable = {"startup": {"outcome": "startup_refused", "error": REFUSAL.format(E=64)}}
    every = {"startup": {"outcome": "startup_refused", "error": REFUSAL.format(E=96)}}
    three = {"block_size": 32, "num_gpu_blocks_override": 3, "max_model_len": 128}
    d = div("startup.numbers.estimated_max_model_len", 64, 96, kind="startup")
    assert sig(d, ctx(three, left=usable, right=every)) == "capacity_overhang"
    # the refusals are not the null block apart: not this rule
    seq = div("startup.numbers.max_seq_len", 128, 160, kind="startup")
    assert sig(seq, ctx(three, left=usable, right=every)) == "capacity_overhang"
    assert sig(seq, ctx(three, left=usable, right=usable)) == "other"
    off = {"startup": {"outcome": "startup_refused", "error": REFUSAL.format(E=32)}}
    assert sig(seq, ctx(three, left=off, right=every)) == "other"


@pytest.mark.parametrize(
    ("left", "right", "expected"),
    [(64, 48, "capacity_overhang"), (48, 64, "capacity_overhang"), (64, 32, "other")],
)
def test_capacity_auto_fit_and_models_max_model_len(left: int, right: int, expected: str) -> None:
    for path in ("startup.max_model_len", "models.data[0].max_model_len"):
        assert sig(div(path, left, right), ctx(BLOCKS_4)) == expected


def test_capacity_models_length_off_by_one_block_but_not_the_null_block() -> None:
    # 80 vs 64 is one block, but N=4 makes the null-block pair (48, 64)
    assert sig(div("startup.max_model_len", 80, 64), ctx(BLOCKS_4)) == "other"


# -- self_preemption_wedge -----------------------------------------------------------------
WEDGED_SIDE = {
    "outcomes": {"r1": {"outcome": "wedged", "num_preemptions": 1}},
    "wedge": {"step": 47, "stuck": ["r1"], "running": [], "waiting": ["r1"]},
}
FINISHED_SIDE = {"outcomes": {"r1": {"outcome": "finished", "finish_reason": "error"}}}
PORT_REQUEST = [{"id": "r1", "prompt_token_ids": [389, 444, 400], "max_tokens": 56}]


@pytest.mark.parametrize(
    "path",
    ["outcomes.r1.outcome", "steps[46].finished.r1", "wedge", "steps[46].waiting", "num_steps"],
)
def test_wedge_from_scheduler_summaries(path: str) -> None:
    context = ctx(BLOCKS_4, PORT_REQUEST, WEDGED_SIDE, FINISHED_SIDE)
    assert sig(div(path, None, "error", kind="trace"), context) == "self_preemption_wedge"
    # and mirrored (the wedged side on the right)
    mirrored = ctx(BLOCKS_4, PORT_REQUEST, FINISHED_SIDE, WEDGED_SIDE)
    assert sig(div(path, "error", None, kind="trace"), mirrored) == "self_preemption_wedge"


def test_wedge_needs_nothing_running_and_a_preemption() -> None:
    busy = {**WEDGED_SIDE, "wedge": {**WEDGED_SIDE["wedge"], "running": ["r2"]}}
    unpreempted = {**WEDGED_SIDE, "outcomes": {"r1": {"outcome": "wedged", "num_preemptions": 0}}}
    for side in (busy, unpreempted):
        d = div("outcomes.r1.outcome", "wedged", "finished", kind="outcome")
        assert sig(d, ctx(BLOCKS_4, PORT_REQUEST, side, FINISHED_SIDE)) == "other"


def test_wedge_both_wedged_is_not_this_signature() -> None:
    d = div("outcomes.r1.num_output_tokens", 46, 45, kind="outcome")
    assert sig(d, ctx(BLOCKS_4, PORT_REQUEST, WEDGED_SIDE, WEDGED_SIDE)) == "other"


def test_wedge_at_the_serve_tier_by_block_arithmetic() -> None:
    # 3 + 56 - 1 = 58 slots need 4 blocks of 16; 4 blocks with the null one leave 3
    left = {"requests": {"r1": {"outcome": "zero_byte_hang"}}}
    right = {"requests": {"r1": {"outcome": "completed"}}}
    config = {**BLOCKS_4, "max_model_len": 64}
    for path in ("requests.r1.outcome", "requests.r1.ttfb_s", "metrics.vllm:num_requests_waiting"):
        assert sig(
            div(path, "zero_byte_hang", "completed"), ctx(config, PORT_REQUEST, left, right)
        ) == ("self_preemption_wedge")
    fits = [{**PORT_REQUEST[0], "max_tokens": 16}]  # 18 slots: 2 blocks, fits in 3
    assert sig(
        div("requests.r1.outcome", "zero_byte_hang", "completed"), ctx(config, fits, left, right)
    ) == ("other")


# -- max_tokens_clamp ----------------------------------------------------------------------
CLAMP_CONFIG = {"block_size": 16, "max_model_len": 48}
P40 = [{"id": "r1", "prompt_token_ids": list(range(40)), "max_tokens": 16}]


@pytest.mark.parametrize(
    ("path", "left", "right", "expected"),
    [
        ("requests.r1.usage.completion_tokens", 8, 16, "max_tokens_clamp"),
        ("requests.r1.usage.completion_tokens", 16, 8, "max_tokens_clamp"),
        ("requests.r1.usage.completion_tokens", 8, 9, "other"),
        ("requests.r1.usage.total_tokens", 48, 56, "max_tokens_clamp"),
        ("outcomes.r1.num_output_tokens", 8, 16, "max_tokens_clamp"),
        ("requests.r1.choices[0].token_ids", list(range(8)), list(range(16)), "max_tokens_clamp"),
        ("requests.r1.choices[0].finish_reason", "length", "stop", "max_tokens_clamp"),
    ],
)
def test_clamp_counts_and_finish(path: str, left: Any, right: Any, expected: str) -> None:
    assert sig(div(path, left, right), ctx(CLAMP_CONFIG, P40)) == expected


def test_clamp_finish_reason_needs_a_binding_clamp() -> None:
    loose = [{**P40[0], "max_tokens": 4}]  # min(8, 4) = 4: the clamp does not bind
    d = div("requests.r1.choices[0].finish_reason", "length", "stop")
    assert sig(d, ctx(CLAMP_CONFIG, loose)) == "other"


def test_clamp_uses_the_completions_default_and_observed_prompt_length() -> None:
    text_request = [{"id": "r1", "prompt": "forty tokens of text"}]  # max_tokens absent: 16
    side = {"requests": {"r1": {"usage": {"prompt_tokens": 40}}}}
    d = div("requests.r1.usage.completion_tokens", 8, 16)
    assert sig(d, ctx(CLAMP_CONFIG, text_request, side, side)) == "max_tokens_clamp"
    assert sig(d, ctx(CLAMP_CONFIG, text_request)) == "other"  # P unknown


def test_clamp_max_tokens_rejected_on_one_side_only() -> None:
    big = [{"id": "r1", "prompt_token_ids": [1, 2, 3], "max_tokens": 5000}]
    error = {
        "message": "max_tokens=5000 cannot be greater than max_model_len=64",
        "param": "max_tokens",
    }
    left = {"requests": {"r1": {"outcome": "completed", "status": 200}}}
    right = {"requests": {"r1": {"outcome": "http_error", "status": 400, "error": error}}}
    config = {"block_size": 16, "max_model_len": 64}
    for path, lv, rv in [
        ("requests.r1.status", 200, 400),
        ("requests.r1.outcome", "completed", "http_error"),
        ("requests.r1.error.param", None, "max_tokens"),
        ("requests.r1.usage.completion_tokens", 61, None),
    ]:
        assert sig(div(path, lv, rv), ctx(config, big, left, right)) == "max_tokens_clamp", path
    # no context: the error body's param alone
    assert sig(div("requests.r1.error.param", None, "max_completion_tokens")) == "max_tokens_clamp"
    # both sides rejected, differently: that is the error's shape
    assert sig(div("requests.r1.error.param", "input_tokens", "max_tokens")) == "error_shape"


def test_clamp_rejected_on_one_side_the_other_failing_a_later_check() -> None:
    # prompt 96 at max_model_len 96: upstream clamps to 0 and rejects max_tokens; unclamped,
    # the request reaches the "prompt plus requested output tokens" check (no param)
    full = [{"id": "r1", "prompt_token_ids": [1] * 96}]  # completions: max_tokens 16 default
    clamped = {"message": "max_tokens must be at least 1, got 0.", "param": "max_tokens"}
    later = {"message": "The decoder prompt (length 96) plus ... is longer", "param": None}
    left = {"requests": {"r1": {"outcome": "http_error", "status": 400, "error": clamped}}}
    right = {"requests": {"r1": {"outcome": "http_error", "status": 400, "error": later}}}
    config = {"block_size": 32, "max_model_len": 96}
    for path, lv, rv in [
        ("requests.r1.error.param", "max_tokens", None),
        ("requests.r1.error.message", clamped["message"], later["message"]),
    ]:
        result = classify_divergence(div(path, lv, rv), ctx(config, full, left, right))
        assert result.signature is Signature.MAX_TOKENS_CLAMP, path
        assert "the clamp binds: M-P=0 < 16" in result.rule
    # the clamp does not bind (max_tokens 5 with headroom 32): a different error is its shape
    short = [{"id": "r1", "prompt_token_ids": [1] * 64, "max_tokens": 5}]
    d = div("requests.r1.error.param", "max_tokens", None)
    assert sig(d, ctx(config, short, left, right)) == "error_shape"


def test_clamp_metric_request_params_max_tokens() -> None:
    d = div("metrics.vllm:request_params_max_tokens_sum", 8, 16, kind="metrics")
    assert sig(d, ctx(CLAMP_CONFIG, P40)) == "max_tokens_clamp"
    assert sig(
        div("metrics.vllm:request_params_max_tokens_sum", 8, 12), ctx(CLAMP_CONFIG, P40)
    ) == ("metrics")


# -- reasoning_budget ----------------------------------------------------------------------
def _chunk(**delta: Any) -> dict[str, Any]:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}


def _stream(field: str) -> list[Any]:
    finish = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
    return [_chunk(role="assistant", content=""), _chunk(**{field: "hm"}), finish, "[DONE]"]


@pytest.mark.parametrize(
    ("path", "left", "right"),
    [
        ("requests.r1.choices[0].message.reasoning", None, "think think"),
        ("requests.r1.choices[0].message.reasoning_content", "think think", None),
        ("requests.r1.usage.completion_tokens_details.reasoning_tokens", 0, 8),
        ("requests.r1.choices[0].message.content", None, ""),
        ("requests.r1.frames", _stream("reasoning"), _stream("reasoning_content")),
        ("requests.r1.frames", _stream("reasoning"), _stream("content")),
    ],
)
def test_reasoning(path: str, left: Any, right: Any) -> None:
    assert sig(div(path, left, right)) == "reasoning_budget"


def test_reasoning_content_text_differs_only_with_a_reasoning_parser() -> None:
    d = div("requests.r1.choices[0].message.content", "a", "b")
    assert sig(d) == "other"
    assert sig(d, ctx({"reasoning_parser": "deepseek_r1"})) == "reasoning_budget"


# -- error_shape ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "left", "right"),
    [
        ("requests.r1.error.message", "maximum context length is 48", "context too long"),
        ("requests.r1.error.type", "BadRequestError", "invalid_request_error"),
        ("requests.r1.status", 400, 422),
        ("requests.r1.outcome", "http_error", "completed"),
        ("requests.r1.body", {"error": {"param": "input_tokens"}}, {"detail": "x"}),
    ],
)
def test_error_shape(path: str, left: Any, right: Any) -> None:
    assert sig(div(path, left, right)) == "error_shape"


# -- sse_framing ---------------------------------------------------------------------------
def test_frame_skeleton_collapses_deltas() -> None:
    frames = [
        "data: " + '{"choices":[{"delta":{"role":"assistant","content":""}}]}',
        _chunk(content="a"),
        _chunk(content="b"),
        {"choices": [{"delta": {}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"completion_tokens": 2}},
        "data: [DONE]",
    ]
    assert frame_skeleton(frames) == ("role", "delta*", "finish", "usage", "done")


@pytest.mark.parametrize(
    ("path", "left", "right"),
    [
        ("requests.r1.frames", _stream("content"), _stream("content")[:-1]),  # no [DONE]
        ("requests.r1.frames", _stream("content"), _stream("content")[1:]),  # no role chunk
        ("requests.r1.frames[2].object", "chat.completion.chunk", "chat.completion"),
        ("requests.r1.frames[3]", "[DONE]", None),
        ("requests.r1.headers.content-type", "text/event-stream", "application/json"),
    ],
)
def test_sse_framing(path: str, left: Any, right: Any) -> None:
    assert sig(div(path, left, right)) == "sse_framing"


def test_frames_with_the_same_shape_and_fields_are_not_framing() -> None:
    left = _stream("content")
    right = [*left[:1], _chunk(content="other text"), *left[2:]]
    assert sig(div("requests.r1.frames", left, right)) == "other"


# -- metrics, timing, other ----------------------------------------------------------------
def test_metrics_timing_other() -> None:
    assert sig(div("metrics.vllm:num_requests_running", 1, 0)) == "metrics"
    assert sig(div("serve.metrics.after.vllm:kv_cache_usage_perc", 0.5, 0.7)) == "metrics"
    assert sig(div("requests.r1.ttft_s", 0.1, 3.0)) == "timing"
    assert sig(div("requests.r1.first_token", 0.1, 3.0, kind="timing")) == "timing"
    assert sig(div("steps[3].block_ids.r1", [1, 2], [2, 1], kind="trace")) == "other"
    assert sig(div("requests.r1.choices[0].text", "a", "b")) == "other"


def test_every_signature_is_reachable_and_names_its_rule() -> None:
    seen = {
        classify_divergence(div("requests.r1.status", 400, 500)).rule,
        classify_divergence(div("metrics.vllm:x", 1, 2)).rule,
    }
    assert all(rule and rule != "no rule matched" for rule in seen)
    assert set(SIGNATURES) == {s.value for s in Signature}


# -- a real scheduler-tier run -------------------------------------------------------------
def test_real_run_abort_instead_of_wedge_is_all_self_preemption_wedge(
    scripted_model_dir: Path,
) -> None:
    """The port's wedge (engine) vs a target that finishes the request with an error at the
    step where the engine preempts it: the runner's differ finds several divergences (trace,
    wedge, outcome) and every one is a self-preemption wedge, nothing unrelated."""
    scenario = load_scenario(ROOT / "scenarios" / "scheduler" / "port-wedge-bs16.yaml")
    engine_run = run_target(scenario, EngineTarget(str(scripted_model_dir)))
    assert engine_run.summary.wedge is not None
    wedge_step = engine_run.summary.wedge.step
    aborted = replace(
        engine_run.steps[wedge_step - 1],
        finished={"r1": "error"},
        preempted_req_ids=(),
        waiting=(),
        running=(),
    )
    replay = ReplayTarget([*engine_run.steps[: wedge_step - 1], aborted], name="abort")
    result, runs = run_scenario(scenario, [EngineTarget(str(scripted_model_dir)), replay])
    assert len(result.divergences) >= 3
    context = SignatureContext.build(scenario, runs[0].summary, runs[1].summary)
    kinds = {d.kind for d in result.divergences}
    assert {"trace", "outcome", "wedge"} <= kinds
    assert {signature_of(d, context) for d in result.divergences} == {
        Signature.SELF_PREEMPTION_WEDGE
    }


# -- the serve tier's own observation shapes (parity.serve) ---------------------------------
def _serve_run(target: str, outcome: str = "completed", **fields: Any) -> dict[str, Any]:
    from parity.serve.observe import Parsed, RequestObservation
    from parity.serve.pool import StartupRecord
    from parity.serve.run import ServeRun, TargetFacts

    startup = fields.pop("startup", StartupRecord(target, "started"))
    observation = RequestObservation(
        request_id="r1",
        spec_id="r1",
        endpoint=fields.pop("endpoint", "completions"),
        stream=False,
        outcome=outcome,
        detail="",
        status=fields.pop("status", 200),
        result=Parsed(**fields.pop("result", {})),
        frames=fields.pop("frames", ()),
    )
    facts = TargetFacts(max_model_len=fields.pop("max_model_len", None))
    return ServeRun(target, startup, (observation,), facts, **fields).to_json()


def test_serve_startup_record_with_the_estimate_in_its_numbers() -> None:
    from parity.serve.pool import StartupRecord

    refused = StartupRecord(
        "oracle",
        "startup_refused",
        error="ValueError: To serve at least one request ... estimated maximum model length is 48.",
        numbers={"estimated_max_model_len": 48, "max_seq_len": 2048},
    )
    left = _serve_run("engine", max_model_len=64)
    right = _serve_run("oracle", outcome="startup_refused", startup=refused)
    context = ctx(BLOCKS_4, PORT_REQUEST, left, right)
    assert sig(div("startup.outcome", "started", "startup_refused"), context) == (
        "capacity_overhang"
    )
    assert sig(div("observations[0].outcome", "completed", "startup_refused"), context) == (
        "capacity_overhang"
    )
    # auto-fit on both: 64 (all blocks) vs 48 (usable blocks)
    assert sig(div("facts.max_model_len", 64, 48), ctx(BLOCKS_4)) == "capacity_overhang"
    assert sig(div("startup.numbers.auto_fit_max_model_len", 64, 48), ctx(BLOCKS_4)) == (
        "capacity_overhang"
    )


def test_serve_wedge_from_observations() -> None:
    left = _serve_run("engine", outcome="zero_byte_hang", max_model_len=64, status=None)
    right = _serve_run("oracle[unchecked]", outcome="completed", max_model_len=64)
    context = ctx(BLOCKS_4, PORT_REQUEST, left, right)  # max_model_len from /v1/models
    for path in ("observations[0].outcome", "requests.r1.t_first_byte_ms", "health[3].status"):
        assert sig(div(path, 1, 2), context) == "self_preemption_wedge", path


def test_serve_clamp_and_error_shape_from_result_fields() -> None:
    error = {"message": "max_tokens=5000 cannot be greater than max_model_len=64. (...)"}
    error |= {"type": "BadRequestError", "param": "max_tokens", "code": 400}
    left = _serve_run("engine", max_model_len=64, result={"usage": {"prompt_tokens": 3}})
    right = _serve_run(
        "oracle", outcome="http_error", status=400, max_model_len=64, result={"error": error}
    )
    big = [{"id": "r1", "prompt": "hi", "max_tokens": 5000}]
    context = ctx({"block_size": 16}, big, left, right)
    assert sig(div("requests.r1.status", 200, 400), context) == "max_tokens_clamp"
    other_error = {**error, "param": "input_tokens"}
    both = ctx({"block_size": 16}, big, {**right}, _serve_run("x", "http_error", status=400,
               result={"error": other_error}))  # fmt: skip
    assert sig(div("requests.r1.result.error.message", "a", "b"), both) == "error_shape"


def test_serve_reasoning_key_text_and_raw_frames() -> None:
    from parity.serve.observe import SSEFrame

    def frames(key: str) -> list[Any]:
        chunks = [
            '{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}',
            json.dumps({"choices": [{"index": 0, "delta": {key: "hm"}}]}),
            '{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}',
            "[DONE]",
        ]
        return [SSEFrame(float(i), f"data: {c}").to_json() for i, c in enumerate(chunks)]

    assert sig(div("requests.r1.result.reasoning_key", "reasoning", "reasoning_content")) == (
        "reasoning_budget"
    )
    chat = ctx(requests=[{"id": "r1", "messages": [{"role": "user", "content": "q"}]}])
    assert sig(div("requests.r1.result.text", None, "answer"), chat) == "reasoning_budget"
    assert sig(div("requests.r1.result.text", None, "answer")) == "other"  # completions
    left, right = frames("reasoning"), frames("reasoning_content")
    assert sig(div("requests.r1.frames", left, right)) == "reasoning_budget"
    assert sig(div("requests.r1.frames", left, left[:-1])) == "sse_framing"
    assert sig(div("requests.r1.done", True, False)) == "sse_framing"
    assert frame_skeleton(left) == ("role", "delta", "finish", "done")
    assert sig(div("metrics_after.samples.vllm:num_requests_running", 1.0, 0.0)) == "metrics"
    assert sig(div("requests.r1.outcome", "timeout", "completed")) == "timing"
