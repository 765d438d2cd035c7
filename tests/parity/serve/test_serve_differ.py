"""The serve-tier differ on synthetic observations: what is normalised away, what is found, and
the signature each finding gets; the serve expect check and the JSON round-trip of results."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from parity.loader import parse_scenario
from parity.results import RunReport, ScenarioResult
from parity.serve.differ import diff_serve_runs, frame_kinds, key_shape
from parity.serve.expect import check_serve_expect
from parity.serve.observe import MetricsSnapshot, Parsed, RequestObservation, SSEFrame
from parity.serve.pool import StartupRecord
from parity.serve.run import ServeRun, TargetFacts
from parity.serve.suite import judge, startup_failed
from parity.signatures import SignatureContext, classify_divergence

pytestmark = pytest.mark.timeout(30)

SCENARIO = """\
id: synthetic
description: d
tier: serve
config: {block_size: 32, num_gpu_blocks_override: 3, max_model_len: 96, reasoning_parser: deepseek_r1}
requests:
  - id: r1
    endpoint: completions
    prompt_token_ids: [389, 430]
    max_tokens: 8
"""


def scenario(text: str = SCENARIO, **limits: Any) -> Any:
    if limits:
        text += "limits: " + json.dumps(limits) + "\n"
    return parse_scenario(text, "synthetic.yaml", stem="synthetic")


def body(text: str = " 5 4", ids: tuple[int, ...] = (261, 260), **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "token_ids": list(ids), "finish_reason": "length"}
    choice.update(extra.pop("choice", {}))
    data = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "scripted",
        "choices": [choice],
        "usage": {"prompt_tokens": 2, "completion_tokens": len(ids), "total_tokens": 2 + len(ids)},
    }
    data.update(extra)
    return data


def plain(data: dict[str, Any], rid: str = "r1", status: int = 200) -> RequestObservation:
    from parity.serve.observe import parse_body

    text = json.dumps(data)
    return RequestObservation(
        request_id=rid,
        spec_id=rid.split("#")[0],
        endpoint="completions",
        stream=False,
        outcome="completed" if status < 400 else "http_error",
        detail="",
        status=status,
        headers={"content-type": "application/json"},
        body=text,
        result=parse_body(text, status),
    )


def streamed(chunks: list[dict[str, Any] | None], rid: str = "r1") -> RequestObservation:
    from parity.serve.observe import parse_frames

    frames = tuple(
        SSEFrame(t_ms=float(i), raw="data: " + ("[DONE]" if c is None else json.dumps(c)))
        for i, c in enumerate(chunks)
    )
    return RequestObservation(
        request_id=rid,
        spec_id=rid,
        endpoint="completions",
        stream=True,
        outcome="completed",
        detail="",
        status=200,
        headers={"content-type": "text/event-stream; charset=utf-8"},
        frames=frames,
        done=chunks[-1] is None,
        result=parse_frames(frames),
    )


def chunk(text: str, ids: list[int], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "token_ids": ids, "finish_reason": finish}
    return {"id": "c", "created": 2, "object": "text_completion", "choices": [choice], **extra}


def run(target: str, *observations: RequestObservation, **fields: Any) -> ServeRun:
    defaults: dict[str, Any] = {
        "startup": StartupRecord(target, "started", port=1),
        "facts": TargetFacts(model_id="scripted", max_model_len=96),
        "server_alive_after": True,
    }
    defaults.update(fields)
    return ServeRun(target=target, observations=observations, **defaults)


def signature(sc: Any, left: ServeRun, right: ServeRun, index: int = 0) -> str:
    found = diff_serve_runs(sc, left, right)
    context = SignatureContext.build(sc, left, right)
    return classify_divergence(found[index], context).signature.value


def test_identical_runs_and_ignored_fields_are_parity() -> None:
    left = run("engine", plain(body()))
    other = body(id="cmpl-other", created=99, system_fingerprint="fp", service_tier=None)
    right = run("oracle", plain(other))
    assert diff_serve_runs(scenario(), left, right) == ()


def test_null_and_absent_are_the_same() -> None:
    left = run("engine", plain(body(choice={"logprobs": None, "stop_reason": None})))
    right = run("oracle", plain(body()))
    assert diff_serve_runs(scenario(), left, right) == ()


def test_chunk_boundaries_do_not_count_but_frame_kinds_do() -> None:
    a = [chunk(" 5", [261]), chunk(" 4", [260], "length"), None]
    b = [chunk(" 5 4", [261, 260]), chunk("", [], "length"), None]
    left, right = run("engine", streamed(a)), run("oracle", streamed(b))
    assert frame_kinds(left.observations[0]) == ("delta*", "finish", "done")
    merged = run("oracle", streamed([chunk(" 5 4", [261, 260], "length"), None]))
    assert diff_serve_runs(scenario(), left, merged) == ()  # finish in the last text frame
    assert diff_serve_runs(scenario(), left, right) == ()
    usage = {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}
    with_usage = [*a[:-1], {"id": "u", "object": "text_completion", "choices": [], "usage": usage}]
    right = run("oracle", streamed([*with_usage, None]))
    found = diff_serve_runs(scenario(), left, right)
    paths = [d.path for d in found]
    assert "requests.r1.frames" in paths and "requests.r1.usage.total_tokens" in paths
    frames = next(d for d in found if d.path == "requests.r1.frames")
    assert frames.right == ["delta*", "finish", "usage", "done"] and frames.kind == "frames"
    index = paths.index("requests.r1.frames")
    assert signature(scenario(), left, right, index) == "sse_framing"


def test_startup_refusal_of_one_side_is_a_capacity_overhang() -> None:
    error = "ValueError: ... the estimated maximum model length is 64. Try increasing ..."
    refused = StartupRecord("oracle", "startup_refused", error=error)
    left = run("engine", plain(body()))
    right = run("oracle", replace(plain(body()), outcome="startup_refused"), startup=refused)
    found = diff_serve_runs(scenario(), left, right)
    assert [(d.kind, d.path) for d in found] == [("startup", "startup")]
    assert found[0].left == "started" and found[0].right.startswith("refused: ValueError")
    assert found[0].location == "synthetic.yaml:4"
    assert signature(scenario(), left, right) == "capacity_overhang"


def test_both_refused_compares_error_class_and_numbers() -> None:
    numbers = {"estimated_max_model_len": 64, "num_gpu_blocks_override": 3}
    a = StartupRecord("engine", "startup_refused", error="ValueError: x", numbers=numbers)
    b = StartupRecord("oracle", "startup_refused", error="RuntimeError: y",
                      numbers={"estimated_max_model_len": 32})  # fmt: skip
    found = diff_serve_runs(scenario(), run("engine", startup=a), run("oracle", startup=b))
    assert [d.path for d in found] == [
        "startup.error_type",
        "startup.numbers.estimated_max_model_len",
    ]


def test_a_startup_number_only_one_log_prints_is_not_compared() -> None:
    a = StartupRecord("oracle", "started", numbers={"auto_fit_max_model_len": 96})
    b = StartupRecord("other-server", "started")  # its log has no such line
    assert diff_serve_runs(scenario(), run("oracle", startup=a), run("x", startup=b)) == ()
    b = StartupRecord("other-server", "started", numbers={"auto_fit_max_model_len": 64})
    found = diff_serve_runs(scenario(), run("oracle", startup=a), run("x", startup=b))
    assert [d.path for d in found] == ["startup.numbers.auto_fit_max_model_len"]


def test_error_bodies_are_compared_exactly() -> None:
    error = {"message": "max_tokens=100 cannot be greater", "type": "BadRequestError",
             "param": "max_tokens", "code": 400}  # fmt: skip
    left = run("engine", plain({"error": error}, status=400))
    right = run("oracle", plain({"error": {**error, "message": "other"}}, status=400))
    found = diff_serve_runs(scenario(), left, right)
    assert [d.path for d in found] == ["requests.r1.error.message"]
    assert signature(scenario(), left, right) == "error_shape"


def test_outcome_difference_keeps_status_and_error_only() -> None:
    error = {"message": "m", "type": "BadRequestError", "param": "max_tokens", "code": 400}
    left = run("engine", plain(body()))
    right = run("oracle", plain({"error": error}, status=400))
    found = diff_serve_runs(scenario(), left, right)
    assert [d.path for d in found] == [
        "requests.r1.outcome",
        "requests.r1.status",
        "requests.r1.error",
    ]
    assert signature(scenario(), left, right) == "max_tokens_clamp"  # only one side rejected


def logprob_body(values: list[float], ranks: list[str]) -> dict[str, Any]:
    top = [dict(zip(ranks, values, strict=True))] * 2
    lp = {"tokens": [" 5", " 4"], "token_logprobs": values[:2], "top_logprobs": top,
          "text_offset": [0, 2]}  # fmt: skip
    return body(choice={"logprobs": lp})


def test_logprobs_tolerance_and_exact_ranks() -> None:
    base = logprob_body([-0.1, -2.0, -3.0], [" 5", " um", "A"])
    near = logprob_body([-0.1004, -2.0004, -3.0], [" 5", " um", "A"])
    far = logprob_body([-0.2, -2.0, -3.0], [" 5", " um", "A"])
    swapped = logprob_body([-0.1, -2.0, -3.0], [" 5", "A", " um"])
    sc = scenario()
    assert diff_serve_runs(sc, run("e", plain(base)), run("o", plain(near))) == ()
    found = diff_serve_runs(sc, run("e", plain(base)), run("o", plain(far)))
    assert [d.path for d in found] == [
        "requests.r1.logprobs[0].logprob",
        "requests.r1.logprobs[0].top_logprobs.values",
    ]
    found = diff_serve_runs(sc, run("e", plain(base)), run("o", plain(swapped)))
    assert [d.path for d in found] == ["requests.r1.logprobs[0].top_logprobs.ranks"]
    loose = scenario(logprob_tolerance=0.5)
    assert diff_serve_runs(loose, run("e", plain(base)), run("o", plain(far))) == ()


def test_reasoning_split_differences() -> None:
    text = SCENARIO.replace("endpoint: completions\n    prompt_token_ids: [389, 430]",
                            'endpoint: chat\n    messages: [{role: user, content: "x"}]')  # fmt: skip
    sc = parse_scenario(text, "synthetic.yaml", stem="synthetic")

    def chat(content: str | None, reasoning: str | None, key: str = "reasoning") -> Any:
        message = {"role": "assistant", "content": content, key: reasoning}
        data = {"object": "chat.completion", "model": "scripted",
                "choices": [{"index": 0, "message": message, "finish_reason": "length"}]}  # fmt: skip
        return replace(plain(data), endpoint="chat")

    left = run("engine", chat(None, " x y"))
    right = run("oracle", chat(" 1", " x"))
    found = diff_serve_runs(sc, left, right)
    assert [d.path for d in found][:2] == ["requests.r1.text", "requests.r1.reasoning"]
    assert signature(sc, left, right) == "reasoning_budget"
    renamed = run("oracle", chat(None, " x y", key="reasoning_content"))
    found = diff_serve_runs(sc, left, renamed)
    assert "requests.r1.reasoning_key" in [d.path for d in found]


def metrics(t: float, preemptions: float, tokens: float) -> MetricsSnapshot:
    samples = {"vllm:num_preemptions_total": preemptions, "vllm:generation_tokens_total": tokens}
    return MetricsSnapshot(t_ms=t, samples=samples)


def test_metric_deltas_with_a_preemption_tolerance() -> None:
    left = run("e", metrics_before=metrics(0, 5, 100), metrics_after=metrics(1, 6, 110))
    right = run("o", metrics_before=metrics(0, 0, 0), metrics_after=metrics(1, 3, 10))
    found = diff_serve_runs(scenario(), left, right)
    assert [(d.path, d.left, d.right) for d in found] == [
        ("metrics_after.vllm:num_preemptions_total", 1, 3)
    ]
    assert signature(scenario(), left, right) == "metrics"
    assert diff_serve_runs(scenario(preemptions_tolerance=2), left, right) == ()


def test_timing_only_with_a_tolerance() -> None:
    fast = replace(plain(body()), t_first_token_ms=10.0, t_end_ms=20.0)
    slow = replace(plain(body()), t_first_token_ms=900.0, t_end_ms=950.0)
    left, right = run("e", fast), run("o", slow)
    assert diff_serve_runs(scenario(), left, right) == ()
    found = diff_serve_runs(scenario(latency_tolerance_ms=100), left, right)
    assert [d.kind for d in found] == ["timing", "timing"]
    assert signature(scenario(latency_tolerance_ms=100), left, right) == "timing"


def test_key_shape_collapses_lists_and_drops_ignored_keys() -> None:
    shape = key_shape(body(extra_field=1))
    assert "id" not in shape and "created" not in shape
    assert shape["choices[].index"] == ["0"] and shape["extra_field"] == ["1"]
    assert shape["choices[].text"] == "<present>"


def test_expect_and_verdicts() -> None:
    text = (
        SCENARIO
        + "expect:\n  startup: started\n  status: {r1: 200}\n  num_output_tokens: {r1: 3}\n"
    )
    sc = parse_scenario(text, "synthetic.yaml", stem="synthetic")
    failures = check_serve_expect(sc, run("engine", plain(body())))
    assert [(f.path, f.expected, f.actual) for f in failures] == [
        ("expect.num_output_tokens.r1", 3, 2)
    ]
    refused = run("oracle", startup=StartupRecord("oracle", "startup_refused", error="E"))
    result = judge(sc, [run("engine", plain(body())), refused])
    assert startup_failed(result)  # expect: started, and one side refused
    both = judge(scenario(), [refused, replace(refused, target="other")])
    assert both.status.value == "error" and startup_failed(both)


def test_serve_results_round_trip_through_json() -> None:
    left = run("engine", streamed([chunk(" 5", [261], "length"), None]))
    right = run("oracle", plain(body()), metrics_before=metrics(0, 0, 0))
    result = judge(scenario(), [left, right], 1.5)
    report = RunReport("serve", ("engine", "oracle"), (result,), elapsed_s=2.0)
    loaded = RunReport.from_json(json.loads(report.dumps()))
    assert loaded == report and isinstance(loaded.results[0], ScenarioResult)
    assert isinstance(loaded.results[0].runs[0], ServeRun)
    assert loaded.results[0].runs[0].observations[0].frames[0].t_ms == 0.0


def test_parsed_fields_are_all_compared() -> None:
    left = run("e", replace(plain(body()), result=Parsed(finish_reason="length", text="a")))
    right = run("o", replace(plain(body()), result=Parsed(finish_reason="stop", text="a")))
    assert [d.path for d in diff_serve_runs(scenario(), left, right)] == [
        "requests.r1.finish_reason"
    ]


def test_coalesced_reasoning_deltas_are_chunk_boundaries() -> None:
    """Under load upstream merges deltas and its parser keeps '<think>' text (basic_parsers.py
    :134-148); one token per delta gives an empty frame for '<think>' instead."""
    text = SCENARIO.replace("endpoint: completions\n    prompt_token_ids: [389, 430]",
                            'endpoint: chat\n    messages: [{role: user, content: "x"}]')  # fmt: skip
    sc = parse_scenario(text, "synthetic.yaml", stem="synthetic")

    def delta(ids: list[int], reasoning: str | None = None, **extra: Any) -> dict[str, Any]:
        body = {} if reasoning is None else {"reasoning": reasoning}
        choice = {"index": 0, "delta": body, "token_ids": ids, **extra}
        return {"object": "chat.completion.chunk", "choices": [choice]}

    role = {"object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}  # fmt: skip
    single = [role, delta([395]), delta([362], " g"), delta([363], " h", finish_reason="length")]
    merged = [role, delta([395, 362], "<think> g"), delta([363], " h", finish_reason="length")]
    left = run("engine", replace(streamed([*single, None]), endpoint="chat"))
    right = run("oracle", replace(streamed([*merged, None]), endpoint="chat"))
    assert diff_serve_runs(sc, left, right) == ()
    leaked = [role, delta([395, 362], "<think> g"), delta([363], " h", finish_reason="length")]
    plain_chat = run("oracle", replace(streamed([*leaked, None]), endpoint="chat", stream=False))
    assert diff_serve_runs(sc, left, plain_chat) != ()  # only streams are normalised


def test_every_choice_of_an_n_request_is_compared_by_index() -> None:
    def two(second: str, ids: list[int]) -> dict[str, Any]:
        extra = {"index": 1, "text": second, "token_ids": ids, "finish_reason": "length"}
        data = body()
        data["choices"].append(extra)
        return data

    same = run("e", plain(two(" 7", [262])))
    assert diff_serve_runs(scenario(), same, run("o", plain(two(" 7", [262])))) == ()
    found = diff_serve_runs(scenario(), same, run("o", plain(two(" 8", [263]))))
    assert [(d.path, d.left, d.right) for d in found] == [
        ("requests.r1.choices[1].text", " 7", " 8"),
        ("requests.r1.choices[1].token_ids", [262], [263]),
    ]
    # a choice missing on one side: num_choices, and that choice's fields against nothing
    missing = diff_serve_runs(scenario(), same, run("o", plain(body())))
    assert [d.path for d in missing][:2] == [
        "requests.r1.num_choices",
        "requests.r1.choices[1].finish_reason",
    ]


def test_n_streams_compare_each_choice_regardless_of_interleaving() -> None:
    def c(index: int, text: str, ids: list[int], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": index, "text": text, "token_ids": ids, "finish_reason": finish}
        return {"id": "c", "object": "text_completion", "choices": [choice]}

    # the same two choices, their chunks interleaved in two orders
    a = [c(0, " 1", [1]), c(1, " 5", [5]), c(0, " 2", [2], "length"), c(1, " 6", [6], "length")]
    b = [c(1, " 5", [5]), c(1, " 6", [6], "length"), c(0, " 1", [1]), c(0, " 2", [2], "length")]
    left, right = streamed([*a, None]), streamed([*b, None])
    assert frame_kinds(left) == frame_kinds(right) == (
        "delta*", "finish", "delta*", "finish", "done"
    )  # fmt: skip
    assert diff_serve_runs(scenario(), run("e", left), run("o", right)) == ()
    # one choice ends early on one side: that choice's finish moves, and its tokens differ
    short = [c(0, " 1", [1]), c(1, " 5", [5], "stop"), c(0, " 2", [2], "length")]
    found = diff_serve_runs(scenario(), run("e", left), run("o", streamed([*short, None])))
    paths = [d.path for d in found]
    assert "requests.r1.choices[1].finish_reason" in paths
    assert "requests.r1.choices[1].token_ids" in paths
    assert "requests.r1.token_ids" not in paths  # choice 0 is the same
