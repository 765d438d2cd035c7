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

Both sides use it; the checks are ``contract/protocol_checks.py``: a worker parses requests with
``parse_request`` (``ProtocolError``: answer with ``failure("error", ...)``), the harness checks
responses with ``check_response``.
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
TRACE_FIELDS = tuple(f.name for f in fields(StepTrace))

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
            raise ProtocolError(f"{NOT_UTF8}: {excerpt(line)}") from None
    try:
        value = json.loads(line)
    except ValueError:
        raise ProtocolError(f"{NOT_JSON}: {excerpt(line)}") from None
    if not isinstance(value, dict):
        raise ProtocolError(f"{NOT_OBJECT}: {excerpt(line)}")
    return value


def excerpt(line: bytes | str, limit: int = 120) -> str:
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
    return ok(trace={name: getattr(trace, name) for name in TRACE_FIELDS})


def output_token_at(request_id: str, output_token_ids: tuple[int, ...], index: int) -> int:
    """The scripted token for a request's ``index``-th output (a fake runner's sample)."""
    if not 0 <= index < len(output_token_ids):
        raise ProtocolError(
            f"request {request_id}: the runner samples output token {index} but "
            f"output_token_ids has {len(output_token_ids)} entries"
        )
    return output_token_ids[index]
