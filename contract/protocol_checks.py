"""Checking scheduler-tier protocol messages (docs/scheduler-protocol.md; shapes: ``contract.protocol``).

- worker side: ``parse_request`` turns a request object into ``(op, payload)``: hello's protocol
  number, start's full config (``CONFIG_DEFAULTS`` filled in), submit's ``SubmitRequest``;
- harness side: ``check_response`` accepts a well-formed response to an op, ``parse_startup``
  and ``decode_trace`` read its parts.

Every problem is one ``ProtocolError`` line naming the key (``Unsupported`` for a config key the
protocol does not know). Standard library only. Upstream: none.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

from contract.protocol import (
    CONFIG_DEFAULTS,
    FAILURE_KINDS,
    OPS,
    ProtocolError,
    Startup,
    SubmitRequest,
    Unsupported,
    excerpt,
)
from contract.trace import StepTrace

_CONFIG_TYPES: dict[str, tuple[type, ...]] = {
    "model": (str,),
    "dtype": (str,),
    "scheduling_policy": (str,),
    "enable_chunked_prefill": (bool,),
    "enable_prefix_caching": (bool,),
}
_NULLABLE = {"num_gpu_blocks_override", "max_model_len", "max_num_batched_tokens"}


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


def check_response(op: str, message: dict[str, Any]) -> dict[str, Any]:
    """``message`` if it is a well-formed response to ``op`` (``ProtocolError`` otherwise).
    A failure response is well formed when it carries exactly one of ``FAILURE_KINDS``."""
    flag = message.get("ok")
    if not isinstance(flag, bool):
        raise ProtocolError(
            f"{op} response without a true/false 'ok': {excerpt(json.dumps(message))}"
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
            raise ProtocolError(f"trace.{name} is not {kind}: {excerpt(json.dumps(value))}")
    return StepTrace.from_json(data)
