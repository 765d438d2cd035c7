"""The scheduler-tier worker protocol: message shapes, encode/decode, version, error texts.

The harness drives a scheduler-tier target in a subprocess (a *worker*) with JSON objects, one per
line (UTF-8), on the worker's stdin; the worker answers every request with exactly one JSON line
on its stdout, in order, and writes nothing else there. The full description, with an example
exchange, is ``docs/scheduler-protocol.md``; this module is its executable form (standard
library only, so it also runs inside an old upstream release's environment). Upstream: none
(the trace it carries is ``contract/trace.py``).

Requests (``op``): ``hello``, ``start`` (``config``), ``submit`` (``request``), ``step``, ``close``,
``exit``. Responses: ``{"ok": true, ...}`` or ``{"ok": false, K: "one line"}`` with K one of
``error``, ``refused`` (start only: the target will not run this config) and ``unsupported``
(start only: ``"key: why"``).

Both sides use it: a worker parses requests with ``parse_request`` (``ProtocolError``: answer
with ``failure("error", ...)``), the harness checks responses with ``check_response``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from contract.trace import StepTrace

PROTOCOL_VERSION = 1
OPS = ("hello", "start", "submit", "step", "close", "exit")
FAILURE_KINDS = ("error", "refused", "unsupported")

# Engine args of a ``start`` config (vLLM names) and the value a missing key means.
# ``max_model_len``: null derives it from the model, -1 auto-fits it to the KV cache.
CONFIG_DEFAULTS: dict[str, Any] = {
    "model": None,  # required: absolute path of the model folder
    "dtype": "auto",
    "block_size": 16,
    "num_gpu_blocks_override": None,  # the pool size, null block included; required in practice
    "max_model_len": None,
    "max_num_seqs": 256,
    "max_num_batched_tokens": None,
    "enable_chunked_prefill": True,
    "enable_prefix_caching": True,
    "scheduling_policy": "fcfs",
    "long_prefill_token_threshold": 0,
    "seed": 0,
}
ENGINE_ARGS = tuple(key for key in CONFIG_DEFAULTS if key != "model")
_CONFIG_TYPES: dict[str, tuple[type, ...]] = {
    "model": (str,),
    "dtype": (str,),
    "scheduling_policy": (str,),
    "enable_chunked_prefill": (bool,),
    "enable_prefix_caching": (bool,),
}
_NULLABLE = {"num_gpu_blocks_override", "max_model_len", "max_num_batched_tokens"}

# Error texts (the harness matches none of them; they are what a person reads).
NOT_UTF8 = "not UTF-8"
NOT_JSON = "not JSON"
NOT_OBJECT = "not a JSON object"
NO_SCENARIO = "no scenario is started (send start first)"


class ProtocolError(ValueError):
    """A message that does not follow the protocol (one line)."""


class Refused(Exception):
    """Raised by a worker's ``start``: it will not run this config (one line)."""


class Unsupported(Exception):
    """Raised by a worker's ``start``: it cannot take ``key`` (``why`` in one line)."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"{key}: {why}")
        self.key = key
        self.why = why


class RequestLike(Protocol):
    """What a scheduler-tier target reads of a request (``SubmitRequest``, a scenario's
    ``RequestSpec``)."""

    @property
    def id(self) -> str: ...
    @property
    def prompt_token_ids(self) -> Sequence[int] | None: ...
    @property
    def max_tokens(self) -> int | None: ...
    @property
    def min_tokens(self) -> int: ...
    @property
    def ignore_eos(self) -> bool: ...
    @property
    def stop_token_ids(self) -> Sequence[int]: ...
    @property
    def priority(self) -> int: ...


@dataclass(frozen=True, slots=True)
class SubmitRequest:
    """The ``request`` of a ``submit``: a greedy request and the scripted model's output.

    ``output_token_ids[k]`` is the token the worker's fake model runner samples as the request's
    k-th output token (0-based), ``max_tokens`` entries (min_tokens masking included, never
    stopping at a stop token: stopping is the scheduler's job)."""

    id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    output_token_ids: tuple[int, ...]
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    priority: int = 0

    def to_json(self) -> dict[str, Any]:
        return {f.name: _listed(getattr(self, f.name)) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class Startup:
    """What the target's own startup capacity check says (the scheduler tier runs anyway)."""

    refused: bool = False
    message: str | None = None  # the check's refusal text
    max_model_len: int | None = None  # the length it settled on (auto-fit applied)

    def to_json(self) -> dict[str, Any]:
        return {
            "refused": self.refused,
            "message": self.message,
            "max_model_len": self.max_model_len,
        }


@dataclass(frozen=True, slots=True)
class Started:
    """A successful ``start``: free-text notes for the run and the startup check."""

    notes: tuple[str, ...] = ()
    startup: Startup = field(default_factory=Startup)


# -- encode / decode ------------------------------------------------------------------------------


def encode(message: dict[str, Any]) -> bytes:
    """One protocol line: compact JSON (no NaN), UTF-8, ending in a newline."""
    text = json.dumps(message, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.encode("utf-8") + b"\n"


def decode(line: bytes | str) -> dict[str, Any]:
    """The JSON object of one line (``ProtocolError`` for anything else)."""
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(f"{NOT_UTF8}: {_excerpt(line)}") from None
    try:
        value = json.loads(line)
    except ValueError:
        raise ProtocolError(f"{NOT_JSON}: {_excerpt(line)}") from None
    if not isinstance(value, dict):
        raise ProtocolError(f"{NOT_OBJECT}: {_excerpt(line)}")
    return value


def _excerpt(line: bytes | str, limit: int = 120) -> str:
    text = repr(line.strip())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _listed(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


# -- requests (harness -> worker) -----------------------------------------------------------------


def hello() -> dict[str, Any]:
    return {"op": "hello", "protocol": PROTOCOL_VERSION}


def start(config: dict[str, Any]) -> dict[str, Any]:
    return {"op": "start", "config": dict(config)}


def submit(request: SubmitRequest) -> dict[str, Any]:
    return {"op": "submit", "request": request.to_json()}


def simple(op: str) -> dict[str, Any]:
    """``step``, ``close`` or ``exit``."""
    return {"op": op}


def parse_request(message: dict[str, Any]) -> tuple[str, Any]:
    """``(op, payload)`` of a request: hello's protocol number, start's full config (defaults
    filled in), submit's ``SubmitRequest``, None otherwise. ``ProtocolError`` for a bad shape,
    ``Unsupported`` for an unknown config key."""
    op = message.get("op")
    if op not in OPS:
        raise ProtocolError(f"unknown op {op!r} (expected one of {', '.join(OPS)})")
    if op == "hello":
        return op, _typed(message, "protocol", int, "hello")
    if op == "start":
        config = message.get("config")
        if not isinstance(config, dict):
            raise ProtocolError("start: config must be a JSON object")
        return op, parse_config(config)
    if op == "submit":
        request = message.get("request")
        if not isinstance(request, dict):
            raise ProtocolError("submit: request must be a JSON object")
        return op, parse_submit(request)
    return op, None


def parse_config(config: dict[str, Any]) -> dict[str, Any]:
    """Every key of ``CONFIG_DEFAULTS``, typed; ``Unsupported`` for a key it does not know."""
    for key in config:
        if key not in CONFIG_DEFAULTS:
            raise Unsupported(key, "not a scheduler-tier engine arg of this protocol")
    values = {**CONFIG_DEFAULTS, **config}
    if not isinstance(values["model"], str) or not values["model"]:
        raise ProtocolError("start: config.model must be the model folder's path")
    for key, value in values.items():
        if value is None and key in _NULLABLE:
            continue
        kinds = _CONFIG_TYPES.get(key, (int,))
        if not isinstance(value, kinds) or (kinds == (int,) and isinstance(value, bool)):
            raise ProtocolError(f"start: config.{key} must be {_kind_name(kinds)}, got {value!r}")
    return values


def _kind_name(kinds: tuple[type, ...]) -> str:
    return {str: "a string", bool: "true or false", int: "an integer"}[kinds[0]]


def parse_submit(request: dict[str, Any]) -> SubmitRequest:
    """A ``SubmitRequest`` from the JSON object (``ProtocolError`` naming the bad key)."""
    known = {f.name for f in fields(SubmitRequest)}
    unknown = sorted(set(request) - known)
    if unknown:
        raise ProtocolError(f"submit: unknown request keys {unknown}")
    where = "submit: request"
    request_id = _typed(request, "id", str, where)
    return SubmitRequest(
        id=request_id,
        prompt_token_ids=_ints(request, "prompt_token_ids", where),
        max_tokens=_typed(request, "max_tokens", int, where),
        output_token_ids=_ints(request, "output_token_ids", where),
        min_tokens=_typed(request, "min_tokens", int, where, 0),
        ignore_eos=_typed(request, "ignore_eos", bool, where, False),
        stop_token_ids=_ints(request, "stop_token_ids", where, ()),
        priority=_typed(request, "priority", int, where, 0),
    )


_REQUIRED = object()


def _typed(obj: dict[str, Any], key: str, kind: type, where: str, default: Any = _REQUIRED) -> Any:
    if key not in obj and default is not _REQUIRED:
        return default
    value = obj.get(key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ProtocolError(f"{where}.{key} must be {_kind_name((kind,))}, got {value!r}")
    return value


def _ints(obj: dict[str, Any], key: str, where: str, default: Any = _REQUIRED) -> tuple[int, ...]:
    if key not in obj and default is not _REQUIRED:
        return tuple(default)
    value = obj.get(key)
    if not isinstance(value, list) or not all(_is_int(v) for v in value):
        raise ProtocolError(f"{where}.{key} must be a list of integers, got {value!r}")
    return tuple(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# -- responses (worker -> harness) ----------------------------------------------------------------


def ok(**payload: Any) -> dict[str, Any]:
    return {"ok": True, **payload}


def failure(kind: str, text: str) -> dict[str, Any]:
    """``{"ok": false, kind: text}`` with ``text`` on one line."""
    if kind not in FAILURE_KINDS:
        raise ValueError(f"unknown failure kind {kind!r}")
    return {"ok": False, kind: " ".join(str(text).split()) or "(no message)"}


def hello_response(implementation: str) -> dict[str, Any]:
    return ok(protocol=PROTOCOL_VERSION, implementation=implementation)


def start_response(started: Started) -> dict[str, Any]:
    return ok(notes=list(started.notes), startup=started.startup.to_json())


def step_response(trace: StepTrace) -> dict[str, Any]:
    # The fields as they are (json writes tuples as lists): faster than a deep asdict() copy.
    return ok(trace={name: getattr(trace, name) for name in _TRACE_KINDS})


def check_response(op: str, message: dict[str, Any]) -> dict[str, Any]:
    """``message`` if it is a well-formed response to ``op`` (``ProtocolError`` otherwise).
    A failure response is well formed when it carries exactly one of ``FAILURE_KINDS``."""
    flag = message.get("ok")
    if not isinstance(flag, bool):
        raise ProtocolError(
            f"{op} response without a true/false 'ok': {_excerpt(json.dumps(message))}"
        )
    if not flag:
        kinds = [k for k in FAILURE_KINDS if isinstance(message.get(k), str)]
        allowed = FAILURE_KINDS if op == "start" else ("error",)
        if len(kinds) != 1 or kinds[0] not in allowed:
            raise ProtocolError(f"{op} failure must carry one of {', '.join(allowed)}: {message}")
        return message
    if op == "hello":
        _typed(message, "protocol", int, "hello response")
        _typed(message, "implementation", str, "hello response")
    elif op == "start":
        notes = message.get("notes", [])
        if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
            raise ProtocolError(f"start response: notes must be a list of strings, got {notes!r}")
        parse_startup(message.get("startup", {}))
    elif op == "step":
        trace = message.get("trace")
        if not isinstance(trace, dict):
            raise ProtocolError("step response without a trace object")
        decode_trace(trace)
    return message


def parse_startup(value: Any) -> Startup:
    if not isinstance(value, dict):
        raise ProtocolError(f"start response: startup must be an object, got {value!r}")
    refused = _typed(value, "refused", bool, "start response: startup", False)
    message = value.get("message")
    max_len = value.get("max_model_len")
    if message is not None and not isinstance(message, str):
        raise ProtocolError(f"start response: startup.message must be a string, got {message!r}")
    if max_len is not None and not _is_int(max_len):
        raise ProtocolError(
            f"start response: startup.max_model_len must be an integer, got {max_len!r}"
        )
    return Startup(refused, message, max_len)


# StepTrace field -> its JSON kind: int, ids (list of str), counts (str -> int),
# tokens (str -> list of int), reasons (str -> str), stops (str -> int | str | null).
_TRACE_KINDS = {
    "step": "int",
    "num_scheduled_tokens": "counts",
    "scheduled_new_req_ids": "ids",
    "scheduled_resumed_req_ids": "ids",
    "scheduled_running_req_ids": "ids",
    "preempted_req_ids": "ids",
    "finished": "reasons",
    "stop_reasons": "stops",
    "sampled_token_ids": "tokens",
    "block_ids": "tokens",
    "num_computed_tokens": "counts",
    "running": "ids",
    "waiting": "ids",
    "num_free_blocks": "int",
}
_VALUE_CHECKS = {
    "counts": _is_int,
    "reasons": lambda v: isinstance(v, str),
    "stops": lambda v: v is None or isinstance(v, str) or _is_int(v),
    "tokens": lambda v: isinstance(v, list | tuple) and all(_is_int(t) for t in v),
}


def decode_trace(data: dict[str, Any]) -> StepTrace:
    """A ``StepTrace`` from its JSON object, every field present and of its kind."""
    missing = sorted(set(_TRACE_KINDS) - set(data))
    unknown = sorted(set(data) - set(_TRACE_KINDS))
    if missing or unknown:
        raise ProtocolError(f"trace fields: missing {missing}, unknown {unknown}")
    for name, kind in _TRACE_KINDS.items():
        value = data[name]
        if kind == "int":
            good = _is_int(value)
        elif kind == "ids":
            good = isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
        else:
            check = _VALUE_CHECKS[kind]
            good = isinstance(value, dict) and all(check(v) for v in value.values())
        if not good:
            raise ProtocolError(f"trace.{name} is not {kind}: {_excerpt(json.dumps(value))}")
    return StepTrace.from_json(data)


def output_token_at(request_id: str, output_token_ids: tuple[int, ...], index: int) -> int:
    """The scripted token for a request's ``index``-th output (a fake runner's sample)."""
    if not 0 <= index < len(output_token_ids):
        raise ProtocolError(
            f"request {request_id}: the runner samples output token {index} but "
            f"output_token_ids has {len(output_token_ids)} entries"
        )
    return output_token_ids[index]
