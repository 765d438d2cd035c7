"""contract.protocol and contract.worker: message shapes, one line per answer, clear errors."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from contract import protocol, protocol_checks
from contract.protocol import ProtocolError, Refused, Started, Startup, SubmitRequest, Unsupported
from contract.trace import StepTrace
from contract.worker import serve

TRACE = StepTrace(
    step=1,
    num_scheduled_tokens={"r1": 2},
    scheduled_new_req_ids=("r1",),
    scheduled_resumed_req_ids=(),
    scheduled_running_req_ids=(),
    preempted_req_ids=(),
    finished={"r1": "stop"},
    stop_reasons={"r1": 7},
    sampled_token_ids={"r1": (5,)},
    block_ids={},
    num_computed_tokens={},
    running=(),
    waiting=(),
    num_free_blocks=3,
)
ROOT = Path(__file__).resolve().parents[2]
REQUEST = SubmitRequest("r1", (389, 1), 2, (5, 6), min_tokens=1, stop_token_ids=(6,))


def test_encode_is_one_compact_utf8_line_and_decode_inverts_it() -> None:
    message = {"op": "submit", "request": {**REQUEST.to_json(), "id": "ü\nx"}}
    line = protocol.encode(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1 and b" " not in line
    assert protocol.decode(line) == message
    assert protocol_checks.parse_request(
        protocol.decode(protocol.encode(protocol.submit(REQUEST)))
    ) == (
        "submit",
        REQUEST,
    )


@pytest.mark.parametrize(
    ("line", "expected"),
    [(b"\xff\xfe", "not UTF-8"), (b"hello", "not JSON"), (b"[1, 2]", "not a JSON object")],
)
def test_decode_names_what_is_wrong(line: bytes, expected: str) -> None:
    with pytest.raises(ProtocolError, match=expected):
        protocol.decode(line)


def test_start_config_gets_every_default_and_rejects_unknown_or_mistyped_keys() -> None:
    op, config = protocol_checks.parse_request(
        {"op": "start", "config": {"model": "/m", "seed": 3}}
    )
    assert op == "start" and config == {**protocol.CONFIG_DEFAULTS, "model": "/m", "seed": 3}
    with pytest.raises(Unsupported, match="swap_space: not a scheduler-tier engine arg"):
        protocol_checks.parse_config({"model": "/m", "swap_space": 4})
    with pytest.raises(ProtocolError, match="config.block_size must be an integer, got True"):
        protocol_checks.parse_config({"model": "/m", "block_size": True})
    with pytest.raises(ProtocolError, match="config.model must be the model folder"):
        protocol_checks.parse_config({})
    assert protocol_checks.parse_config({"model": "/m", "max_model_len": -1})["max_model_len"] == -1


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        ({"op": "fly"}, "unknown op 'fly' (expected one of hello, start, submit, step"),
        ({"op": "submit", "request": []}, "submit: request must be a JSON object"),
        ({"op": "submit", "request": {"id": 1}}, "request.id must be a string, got 1"),
        (
            {"op": "submit", "request": {**REQUEST.to_json(), "output_token_ids": [1.5]}},
            "request.output_token_ids must be a list of integers",
        ),
        ({"op": "submit", "request": {**REQUEST.to_json(), "n": 2}}, "unknown request keys ['n']"),
        ({"op": "hello", "protocol": "1"}, "hello.protocol must be an integer"),
    ],
)
def test_bad_requests_are_protocol_errors(request_: dict[str, Any], expected: str) -> None:
    with pytest.raises(ProtocolError) as info:
        protocol_checks.parse_request(request_)
    assert expected in str(info.value)


def test_submit_defaults() -> None:
    minimal = {"id": "a", "prompt_token_ids": [1], "max_tokens": 1, "output_token_ids": [2]}
    assert protocol_checks.parse_submit(minimal) == SubmitRequest("a", (1,), 1, (2,))


def test_check_response_accepts_the_documented_shapes_only() -> None:
    started = protocol.start_response(Started(("n",), Startup(True, "too small", 48)))
    assert protocol_checks.check_response("start", started) is started
    assert protocol_checks.parse_startup(started["startup"]) == Startup(True, "too small", 48)
    assert (
        protocol_checks.check_response("step", protocol.step_response(TRACE))["trace"]["step"] == 1
    )
    assert protocol_checks.check_response("start", protocol.failure("refused", "no\n  way")) == {
        "ok": False,
        "refused": "no way",
    }
    bad = [
        ("hello", {"ok": True, "protocol": 1}),
        ("step", {"ok": "yes"}),
        ("step", {"ok": False, "refused": "only start refuses"}),
        ("submit", {"ok": False, "error": "x", "refused": "y"}),
        ("start", {"ok": True, "notes": "one"}),
        ("start", {"ok": True, "startup": {"refused": "no"}}),
        ("step", {"ok": True}),
    ]
    for op, message in bad:
        with pytest.raises(ProtocolError):
            protocol_checks.check_response(op, message)


def test_decode_trace_checks_every_field_and_round_trips() -> None:
    data = json.loads(json.dumps(TRACE.to_json()))
    assert protocol_checks.decode_trace(data) == TRACE
    for field, value in [("step", "1"), ("running", ["a", 2]), ("finished", {"a": 1})]:
        with pytest.raises(ProtocolError, match=f"trace.{field} is not"):
            protocol_checks.decode_trace({**data, field: value})
    with pytest.raises(ProtocolError, match=r"missing \['waiting'\], unknown \['extra'\]"):
        protocol_checks.decode_trace(
            {**{k: v for k, v in data.items() if k != "waiting"}, "extra": 1}
        )


def test_output_token_at_names_the_request_and_index() -> None:
    assert protocol.output_token_at("r1", (5, 6), 1) == 6
    with pytest.raises(ProtocolError, match="request r1: the runner samples output token 2 but"):
        protocol.output_token_at("r1", (5, 6), 2)


class _Backend:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def start(self, config: dict[str, Any]) -> Started:
        self.calls.append("start")
        if config["block_size"] == 0:
            raise Refused("fake refuses the config: block_size 0")
        if config["scheduling_policy"] == "lottery":
            raise Unsupported("scheduling_policy", "only fcfs")
        return Started(("hi",), Startup())

    def submit(self, request: SubmitRequest) -> None:
        self.calls.append(f"submit {request.id}")
        if not request.prompt_token_ids:
            raise ValueError("The decoder prompt cannot be empty")

    def step(self) -> StepTrace:
        self.calls.append("step")
        return TRACE

    def close(self) -> None:
        self.calls.append("close")


def _session(lines: list[Any]) -> tuple[list[dict[str, Any]], _Backend, int]:
    backend = _Backend()
    raw = b"".join(line if isinstance(line, bytes) else protocol.encode(line) for line in lines)
    out = io.BytesIO()
    code = serve("fake", lambda: backend, stdin=io.BytesIO(raw), stdout=out)
    return [json.loads(x) for x in out.getvalue().splitlines()], backend, code


def test_serve_answers_each_request_once_in_order() -> None:
    config = {"model": "/m"}
    answers, backend, code = _session(
        [
            protocol.hello(),
            {"op": "step"},
            b"\n",
            b"not json\n",
            protocol.start({**config, "block_size": 0}),
            protocol.start({**config, "scheduling_policy": "lottery"}),
            protocol.start(config),
            protocol.submit(REQUEST),
            protocol.submit(SubmitRequest("r2", (), 1, (1,))),
            protocol.simple("step"),
            protocol.simple("close"),
            protocol.simple("exit"),
            protocol.hello(),  # after exit: never read
        ]
    )
    assert code == 0
    assert answers == [
        {"ok": True, "protocol": 1, "implementation": "fake"},
        {"ok": False, "error": "step: no scenario is started (send start first)"},
        {"ok": False, "error": "not JSON: 'not json'"},
        {"ok": False, "refused": "fake refuses the config: block_size 0"},
        {"ok": False, "unsupported": "scheduling_policy: only fcfs"},
        {
            "ok": True,
            "notes": ["hi"],
            "startup": {"refused": False, "message": None, "max_model_len": None},
        },
        {"ok": True},
        {"ok": False, "error": "ValueError: The decoder prompt cannot be empty"},
        {"ok": True, "trace": json.loads(json.dumps(TRACE.to_json()))},
        {"ok": True},
        {"ok": True},
    ]
    assert backend.calls == ["start", "start", "start", "submit r1", "submit r2", "step", "close"]


def test_serve_rejects_another_protocol_version_and_closes_at_eof() -> None:
    answers, backend, code = _session(
        [{"op": "hello", "protocol": 2}, protocol.start({"model": "/m"})]
    )
    assert answers[0] == {"ok": False, "error": "protocol 2 requested, this worker speaks 1"}
    assert code == 0 and backend.calls == ["start", "close"]  # EOF closes the open scenario


def _modules_after_import(*modules: str, flags: tuple[str, ...] = ()) -> set[str]:
    code = f"import sys\nimport {', '.join(modules)}\nprint('\\n'.join(sorted(sys.modules)))"
    proc = subprocess.run(
        [sys.executable, *flags, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    return {name.partition(".")[0] for name in proc.stdout.split()}


def test_the_contract_side_of_the_protocol_is_standard_library_only() -> None:
    # -S: no site-packages at all (a bare interpreter); the repo root is sys.path[0].
    modules = ("contract.protocol_checks", "contract.worker", "contract.scripted.script")
    loaded = _modules_after_import(*modules, flags=("-S",))
    foreign = loaded - set(sys.stdlib_module_names) - {"contract", "__main__"}
    assert not foreign, sorted(foreign)


def test_workers_import_neither_the_harness_nor_each_other() -> None:
    assert not {"parity", "oracle"} & _modules_after_import("engine.core.scheduler_worker")
    assert not {"parity", "engine", "vllm"} & _modules_after_import("oracle.scheduler_worker")
