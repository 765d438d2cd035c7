"""Serve-tier pieces that need no server: target specs, flags, startup logs, the scenario
adapter, SSE and Prometheus parsing, and the observation's JSON round-trip."""

from __future__ import annotations

import json
import sys

import pytest

from parity.errors import TargetSpecError
from parity.loader import parse_scenario
from parity.serve import RequestObservation, ServerConfig, from_scenario, parse_target
from parity.serve.observe import (
    SSEFrame,
    parse_body,
    parse_frames,
    parse_metrics,
    split_sse,
)
from parity.serve.targets import (
    server_argv,
    server_env,
    server_flags,
    startup_error_line,
    startup_numbers,
)

CONFIG = ServerConfig(
    model="/models/scripted",
    engine_args={"block_size": 32, "num_gpu_blocks_override": 4, "enable_prefix_caching": False},
    served_model_name="scripted",
    extra_args=("--max-num-seqs", "8"),
)

# What the pinned oracle prints when it refuses to start (abridged from a real log).
ORACLE_REFUSAL = """\
(APIServer pid=1) WARNING 11-29 08:15:13 [system_utils.py:255] Found ulimit of 20000 and failed \
to automatically increase with error current limit exceeds maximum limit. This can cause fd limit \
errors like `OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n
(EngineCore pid=2) INFO 11-29 08:15:42 [kv_cache_utils.py:2619] Overriding num_gpu_blocks=8192 \
with num_gpu_blocks_override=4
(EngineCore pid=2) ERROR 11-29 08:15:42 [core.py:1510]     raise ValueError(
(EngineCore pid=2) ERROR 11-29 08:15:42 [core.py:1510] ValueError: To serve at least one request \
with the model's max seq len (2048), (0.01 GiB KV cache is needed, which is larger than the \
available KV cache memory (0.0 GiB). Based on the available memory, the estimated maximum model \
length is 96. Try increasing `gpu_memory_utilization`
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def test_parse_target_names_and_labels() -> None:
    assert parse_target("engine").label == "engine"
    unchecked = parse_target("oracle[unchecked]")
    assert unchecked.label == "oracle[unchecked]"
    assert unchecked.serve.env["VLLM_PARITY_ORACLE_UNCHECKED"] == "1"
    profiled = parse_target("engine --divergence legacy-capacity")
    assert profiled.extra_flags == ("--divergence", "legacy-capacity")
    assert profiled.label == "engine --divergence legacy-capacity"
    external = parse_target("external:./my server --port {port}")
    assert external.serve.command == ("./my", "server", "--port", "{port}")
    assert external.label == "external:my"  # short: the program, not the whole command line
    module = parse_target("external:python -m my_server --port {port} --model {model}")
    assert module.label == "external:my_server"
    pinned = parse_target("oracle@0.28.0")
    assert (pinned.name, pinned.version, pinned.label) == ("oracle@0.28.0", "0.28.0", pinned.name)


@pytest.mark.parametrize(
    "spec", ["", "vllm", "external:", "external:./server --port 8000", "external:'unclosed"]
)
def test_bad_target_specs_are_one_line_errors(spec: str) -> None:
    with pytest.raises(TargetSpecError) as info:
        parse_target(spec)
    assert "\n" not in str(info.value)


def test_server_flags_add_what_makes_targets_comparable() -> None:
    flags = server_flags(CONFIG)
    assert flags[:4] == ["--block-size", "32", "--num-gpu-blocks-override", "4"]
    assert "--no-enable-prefix-caching" in flags
    assert flags[flags.index("--dtype") + 1] == "float32"
    assert flags[flags.index("--served-model-name") + 1] == "scripted"
    assert "--enforce-eager" in flags and "--no-async-scheduling" in flags
    assert flags[-2:] == ["--max-num-seqs", "8"]
    bf16 = ServerConfig(model="/m", engine_args={"dtype": "bfloat16"})
    assert server_flags(bf16)[:2] == ["--dtype", "bfloat16"]
    assert server_flags(bf16)[server_flags(bf16).index("--served-model-name") + 1] == "m"


def test_argv_per_kind() -> None:
    engine = server_argv(parse_target("engine --divergence x"), CONFIG, 1234)
    assert engine[:5] == [sys.executable, "-m", "engine", "serve", "/models/scripted"]
    assert engine[-2:] == ["--divergence", "x"] and "1234" in engine
    oracle = server_argv(parse_target("oracle"), CONFIG, 1234)
    assert oracle[1:4] == ["-m", "oracle", "serve"] and "--enforce-eager" in oracle
    appended = server_argv(parse_target("external:srv {model} -p {port}"), CONFIG, 99)
    assert appended[:4] == ["srv", "/models/scripted", "-p", "99"]
    assert appended[4:] == server_flags(CONFIG)
    placed = server_argv(parse_target("external:srv --port={port} {flags} --tail"), CONFIG, 99)
    assert placed[:2] == ["srv", "--port=99"] and placed[-1] == "--tail"


def test_env_marks_unchecked_oracle_only() -> None:
    assert server_env(parse_target("oracle[unchecked]"))["VLLM_PARITY_ORACLE_UNCHECKED"] == "1"
    assert "VLLM_PARITY_ORACLE_UNCHECKED" not in server_env(parse_target("oracle"), {})
    assert server_env(parse_target("engine"), {})["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_startup_error_line_is_the_root_exception() -> None:
    line = startup_error_line(ORACLE_REFUSAL)
    assert line is not None and line.startswith("ValueError: To serve at least one request")
    assert startup_numbers(ORACLE_REFUSAL) == {
        "estimated_max_model_len": 96,
        "max_seq_len": 2048,
        "num_gpu_blocks_override": 4,
    }
    usage = "INFO something\npython -m engine: error: argument --block-size: invalid\n"
    assert startup_error_line(usage) == "python -m engine: error: argument --block-size: invalid"
    assert startup_error_line("just dying\n\n") == "just dying"


SCENARIO = """\
id: serve-demo
description: a serve-tier scenario
tier: serve
config:
  block_size: 32
  max_model_len: 512
  reasoning_parser: deepseek_r1
  extra_args: ["--max-num-seqs", "4"]
requests:
  - id: a
    prompt_token_ids: [389, 429]
    stream: true
    stream_options: {include_usage: true}
    temperature: 0.0
    at_ms: 50
    repeat: 3
    concurrency: 2
  - id: b
    messages: [{role: user, content: "<|think:3|><|answer:2|>"}]
    max_tokens: 7
    return_token_ids: false
limits:
  stall_s: 1.5
"""


def test_adapter_from_a_loaded_scenario() -> None:
    scenario = parse_scenario(SCENARIO, "serve-demo.yaml", stem="serve-demo")
    config, requests, limits = from_scenario(scenario, model="/models/scripted")
    assert config.engine_args == {
        "block_size": 32,
        "max_model_len": 512,
        "reasoning_parser": "deepseek_r1",
    }
    assert config.extra_args == ("--max-num-seqs", "4") and config.model_name == "scripted"
    a, b = requests
    assert (a.endpoint, a.stream, a.at_ms, a.repeat, a.concurrency) == (
        "completions",
        True,
        50.0,
        3,
        2,
    )
    assert a.copy_ids() == ["a#0", "a#1", "a#2"]
    body = a.request_body("scripted")
    assert "max_tokens" not in body  # absent: the server's default is under test
    assert body["prompt"] == [389, 429] and body["stream_options"] == {"include_usage": True}
    assert body["return_token_ids"] is True and body["temperature"] == 0.0
    assert "ignore_eos" not in body and "priority" not in body
    chat = b.request_body("scripted")
    assert b.endpoint == "chat" and chat["max_tokens"] == 7 and chat["return_token_ids"] is False
    assert chat["messages"] == [{"role": "user", "content": "<|think:3|><|answer:2|>"}]
    assert (limits.stall_s, limits.request_timeout_s) == (1.5, 60.0)


def test_sse_split_keeps_partial_events() -> None:
    buffer = bytearray(b'data: {"a": 1}\n\ndata: [DONE]\r\n\r\ndata: {"b"')
    assert split_sse(buffer) == ['data: {"a": 1}', "data: [DONE]"]
    assert bytes(buffer) == b'data: {"b"'


def test_chat_frames_split_reasoning_and_content() -> None:
    payloads = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"index": 0, "delta": {"reasoning": " x"}, "token_ids": [1]}]},
        {"choices": [{"index": 0, "delta": {"reasoning": " y"}, "token_ids": [2]}]},
        {"choices": [{"index": 0, "delta": {"content": " 1"}, "token_ids": [3]}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": None}]},
        {"choices": [], "usage": {"prompt_tokens": 6, "completion_tokens": 3}},
    ]
    frames = tuple(SSEFrame(float(i), "data: " + json.dumps(p)) for i, p in enumerate(payloads))
    parsed = parse_frames((*frames, SSEFrame(9.0, "data: [DONE]")))
    assert (parsed.reasoning, parsed.text, parsed.role) == (" x y", " 1", "assistant")
    assert parsed.reasoning_key == "reasoning" and parsed.token_ids == (1, 2, 3)
    assert parsed.finish_reason == "stop" and parsed.usage == payloads[-1]["usage"]
    assert parsed.num_token_frames == 3


def test_n_choices_are_kept_per_index_in_bodies_and_streams() -> None:
    body = {
        "choices": [  # out of index order on purpose
            {"index": 1, "text": " b", "token_ids": [7, 8], "finish_reason": "length"},
            {"index": 0, "text": " a", "token_ids": [5], "finish_reason": "stop"},
        ]
    }
    parsed = parse_body(json.dumps(body), 200)
    assert (parsed.text, parsed.token_ids, parsed.num_choices) == (" a", (5,), 2)
    other = parsed.other_choices
    assert [(c.index, c.text, c.token_ids, c.finish_reason) for c in other] == [
        (1, " b", (7, 8), "length")
    ]
    payloads = [  # chunks of two choices interleaved, as a server streams them
        {"choices": [{"index": 1, "delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"index": 1, "delta": {"reasoning": "r"}, "token_ids": [9]}]},
        {"choices": [{"index": 0, "delta": {"content": "x"}, "token_ids": [1]}]},
        {"choices": [{"index": 1, "delta": {"content": "y"}, "token_ids": [2]}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {"choices": [{"index": 1, "delta": {}, "finish_reason": "length"}]},
    ]
    frames = tuple(SSEFrame(float(i), "data: " + json.dumps(p)) for i, p in enumerate(payloads))
    streamed = parse_frames(frames)
    assert (streamed.text, streamed.token_ids, streamed.finish_reason) == ("x", (1,), "stop")
    assert streamed.num_choices == 2 and streamed.role == "assistant"
    (second,) = streamed.other_choices
    assert (second.index, second.text, second.reasoning, second.token_ids) == (1, "y", "r", (9, 2))
    assert second.finish_reason == "length"


def test_error_bodies_and_frames() -> None:
    error = {
        "message": "max_tokens=9 cannot be greater",
        "type": "BadRequestError",
        "param": "max_tokens",
        "code": 400,
    }
    assert parse_body(json.dumps({"error": error}), 400).error == error
    frame = SSEFrame(1.0, "data: " + json.dumps({"error": {"message": "boom", "code": 500}}))
    assert parse_frames((frame,)).error == {"message": "boom", "code": 500}
    null_content = {
        "choices": [
            {
                "message": {"role": "assistant", "content": None, "reasoning": " x y"},
                "finish_reason": "length",
            }
        ]
    }
    parsed = parse_body(json.dumps(null_content), 200)
    assert parsed.text is None and parsed.reasoning == " x y" and parsed.finish_reason == "length"


def test_metrics_drop_engine_labels_and_buckets() -> None:
    text = """\
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 1.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="deferred"} 0.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
vllm:num_preemptions_created{engine="0",model_name="m"} 1.7e9
# TYPE vllm:request_params_max_tokens histogram
vllm:request_params_max_tokens_bucket{engine="0",le="1.0",model_name="m"} 0.0
vllm:request_params_max_tokens_sum{engine="0",model_name="m"} 56.0
# TYPE python_gc_objects_collected counter
python_gc_objects_collected_total{generation="0"} 5.0
"""
    snapshot = parse_metrics(text, 3.0)
    assert snapshot.waiting == 1.0 and snapshot.waiting_by_reason == {
        "capacity": 1.0,
        "deferred": 0.0,
    }
    assert snapshot.num_preemptions == 2.0 and snapshot.running is None
    assert snapshot.samples["vllm:request_params_max_tokens_sum"] == 56.0
    assert not any("bucket" in k or "created" in k or "python" in k for k in snapshot.samples)


def test_observation_json_round_trip() -> None:
    frames = (SSEFrame(1.5, 'data: {"choices": []}'), SSEFrame(2.0, "data: [DONE]"))
    obs = RequestObservation(
        request_id="r#1", spec_id="r", endpoint="chat", stream=True, outcome="completed",
        detail="HTTP 200", request_body={"model": "m", "stream": True}, t_headers_ms=0.5,
        status=200, headers={"content-type": "text/event-stream"}, num_bytes=40, frames=frames,
        done=True,
    )  # fmt: skip
    data = json.loads(json.dumps(obs.to_json()))
    assert RequestObservation.from_json(data) == obs


@pytest.mark.parametrize(
    "fields",
    [
        {"endpoint": "chat", "prompt": "hi"},
        {"endpoint": "completions", "messages": ({"role": "user", "content": "hi"},)},
        {"endpoint": "completions"},
        {"prompt": "hi", "prompt_token_ids": (1,)},
        {"prompt": "hi", "repeat": 0},
    ],
)
def test_request_spec_rejects_mismatched_prompt_forms(fields: dict) -> None:
    from parity.serve import ServeRequestSpec

    with pytest.raises(ValueError, match="request r"):
        ServeRequestSpec(id="r", **fields)


def test_negative_and_auto_values_stay_one_argument() -> None:
    auto = server_flags(ServerConfig(model="/m", engine_args={"max_model_len": -1}))
    assert auto[:1] == ["--max-model-len=-1"]
    assert server_flags(ServerConfig(model="/m", engine_args={"max_model_len": "auto"}))[:2] == [
        "--max-model-len",
        "auto",
    ]
