"""Compare two targets' serve-tier runs of one scenario: what a client and an operator see.

Every difference becomes a ``Divergence(kind, path, left, right, location=file:line)`` with a
path that ``parity.signatures`` understands:

- ``startup`` (kind ``startup``): one side started and the other did not (values
  ``"started"`` / ``"refused: <key log line>"``); when both refused, ``startup.outcome``,
  ``startup.error_type`` (the exception class) and ``startup.numbers.<name>`` (the
  estimated maximum model length, the max seq len checked); when both started,
  ``startup.numbers.auto_fit_max_model_len`` (only when both logs print it: a server that is
  not vLLM prints no such line).
- ``facts.max_model_len`` / ``facts.model_id`` (kind ``models``): ``/v1/models`` (the id
  only when both servers were given the served model name).
- ``requests.<id>.<field>`` per request copy (``<id>`` is the scenario id, or ``id#k`` for
  a repeated copy): ``outcome`` (kind ``outcome``; when outcomes differ the rest of that request
  is a consequence and only ``status`` / ``error.*`` are added), ``status``,
  ``error.type|param|message|code`` (messages compared exactly: the engine mirrors them),
  ``headers.content-type``, ``finish_reason``, ``stop_reason``, ``role``, ``text``,
  ``reasoning``, ``reasoning_key``, ``token_ids`` (the servers' own when both sent them, else
  the text tokenized on both sides: ``parity.serve.derive``), ``prompt_token_ids`` (only when
  both were asked for token ids), ``num_choices``,
  ``choices[i].<field>`` for the other choices of an ``n > 1`` request (``CHOICE_FIELDS``),
  ``usage.<key>`` (nested keys dotted, e.g. ``usage.completion_tokens_details.reasoning_tokens``),
  ``logprobs.*`` (token and rank order exact, values within ``limits.logprob_tolerance``),
  ``done`` and ``frames`` (the SSE event sequence: role, delta*, finish, usage, error,
  done; see ``frame_kinds``) for streams, ``body.<keys>`` / ``frames.<keys>`` for a
  JSON key present on one side only (or a differing value of a field the other comparisons do
  not cover), and ``t_first_token_ms`` / ``t_end_ms`` (kind ``timing``) only when the scenario
  sets ``limits.latency_tolerance_ms``.
- ``metrics_after.<sample>`` (kind ``metrics``): the change over the scenario of preemptions,
  prompt and generation tokens, ``request_success`` by finish reason and the
  ``request_params_max_tokens`` histogram sum and count.
- ``health.statuses`` / ``health.server_alive_after`` (kind ``health``).
- ``shutdown.sigterm`` (kind ``shutdown``): what SIGTERM did while requests were outstanding
  (``exited`` / ``survived`` / ``gone``; ``ServeRun.sigterm``, set by a repro's ``sigterm``
  leg), when both sides were sent one.

How two values are compared, and the kind a difference gets, is one table, ``RULES``: a path
family (``requests.<id>.`` dropped, so ``requests.usage`` is every request's usage; the longest
family a path starts with wins) -> ``Rule(kind, how, limit)``, where ``how`` is ``exact``,
``tolerance`` (``abs(left - right)`` beyond ``limits.<limit>``, 0 without one; not compared
when that limit is unset or a side has no value) or ``presence`` (compared only when both
sides have a value). The functions below only extract what to compare, in report order.

Normalised away (they must not count): ids, ``created``, ``system_fingerprint``, the token-id
keys when only one side was asked for them (the harness asks only targets that accept
``return_token_ids``), ``null`` versus
an absent key (upstream serialises chunks with ``exclude_unset``, so explicitly passed ``None``
fields appear as ``null`` only sometimes: docs/upstream-behaviour.md, "SSE framing"), SSE chunk
boundaries (text and token ids are compared concatenated; frames that carry no text, role, finish or
usage, e.g. a lone ``<think>`` token's ``token_ids``, are left out of the kind sequence), and timing
unless a tolerance is set. Chunk boundaries move with load: upstream's output collector merges
the outputs a slow consumer has not read into one delta, and then its deepseek_r1 streaming
parser keeps the ``<think>`` text of a delta that starts reasoning with more tokens
(``reasoning/basic_parsers.py:134-148``: ``"<think> g h i j"``) where a one-token delta gives
no text (``:108-112``). So with a reasoning parser, ``<think>`` is removed from streamed
reasoning before comparing (non-streaming reasoning is compared as is).

Upstream shapes compared: ``vllm/entrypoints/openai/completion/protocol.py`` and
``chat_completion/protocol.py`` (bodies and chunks), ``entrypoints/serve/exception_handling/
error_response.py`` (error bodies), ``v1/metrics/loggers.py`` (metric names), pin 0.32.0.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from parity.results import Divergence, DivergenceCollector
from parity.scenario import Scenario
from parity.serve.observe import RequestObservation
from parity.serve.pool import StartupRecord
from parity.serve.run import ServeRun
from parity.signatures import frame_kind

IGNORED_KEYS = frozenset({"id", "created", "system_fingerprint"})
# ... and, when only one side was asked for token ids (the harness asks a target only when it
# accepts return_token_ids), the keys that answer that question.
HARNESS_KEYS = IGNORED_KEYS | {"token_ids", "prompt_token_ids"}
# Response keys compared by the parsed comparisons (not by the key-shape walk).
COVERED_KEYS = frozenset(
    {"text", "content", "reasoning", "reasoning_content", "finish_reason", "stop_reason"}
    | {"token_ids", "prompt_token_ids", "logprobs", "usage", "error"}
)
RESULT_FIELDS = (
    *("finish_reason", "stop_reason", "role", "text", "reasoning", "reasoning_key"),
    *("token_ids", "prompt_token_ids", "num_choices"),
)
# Compared for each choice after the first (n > 1), as ``choices[<index>].<field>``.
CHOICE_FIELDS = ("finish_reason", "stop_reason", "text", "reasoning", "token_ids")
# Frame fields whose values are compared (all others: presence only; values vary per frame).
FRAME_VALUE_KEYS = frozenset({"object", "model", "index", "role"})
METRIC_PREFIXES = (
    "vllm:num_preemptions_total",
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:request_success_total",
    "vllm:request_params_max_tokens_sum",
    "vllm:request_params_max_tokens_count",
)
PREEMPTIONS = "vllm:num_preemptions_total"
# Startup-log numbers compared (the others, e.g. num_gpu_blocks_override, echo the flags).
STARTUP_NUMBERS = ("estimated_max_model_len", "max_seq_len", "auto_fit_max_model_len")
ERROR_KEYS = ("type", "param", "message", "code")
THINK_START = "<think>"
ABSENT = "<absent>"


@dataclass(frozen=True, slots=True)
class Rule:
    """How the values at a path family are compared, and the ``Divergence.kind`` of a
    difference; ``limit`` names the ``limits`` key that gives a tolerance its slack."""

    kind: str
    how: Literal["exact", "tolerance", "presence"] = "exact"
    limit: str | None = None


# path family -> rule; requests.<id>.<field> is looked up as requests.<field>
RULES: dict[str, Rule] = {
    "startup": Rule("startup"),  # startup, startup.outcome, .error_type, .numbers.<name>
    "facts": Rule("models"),  # /v1/models
    "requests.outcome": Rule("outcome"),
    "requests": Rule("response"),  # status, error.*, headers.*, result fields, choices, usage
    "requests.logprobs": Rule("response", "tolerance", "logprob_tolerance"),  # diff_logprobs
    "requests.done": Rule("frames"),
    "requests.frames": Rule("frames"),  # the kind sequence, and frames.<keys> (key_shape)
    "requests.t_first_token_ms": Rule("timing", "tolerance", "latency_tolerance_ms"),
    "requests.t_end_ms": Rule("timing", "tolerance", "latency_tolerance_ms"),
    "metrics_after": Rule("metrics", "tolerance"),  # deltas; a sample absent on a side is 0
    f"metrics_after.{PREEMPTIONS}": Rule("metrics", "tolerance", "preemptions_tolerance"),
    "health": Rule("health"),
    "shutdown": Rule("shutdown", "presence"),  # only when both sides were sent SIGTERM
}
_FAMILIES = sorted(RULES, key=len, reverse=True)  # the longest family a path starts with wins


def rule_for(path: str) -> Rule:
    """The rule of a divergence path (``requests.<id>.`` looked up as ``requests.``)."""
    head, _, rest = path.partition(".")
    key = f"requests.{rest.partition('.')[2]}" if head == "requests" else path
    return RULES[next(family for family in _FAMILIES if key.startswith(family))]


class _Out(DivergenceCollector):
    """Collects the divergences of one pair of runs, with scenario locations."""

    def __init__(self, scenario: Scenario, left: ServeRun, right: ServeRun) -> None:
        super().__init__(scenario, left.target, right.target)

    def slack(self, rule: Rule) -> float | None:
        """A tolerance rule's allowed difference (None: not compared)."""
        return getattr(self.scenario.limits, rule.limit) if rule.limit else 0

    def compare(
        self,
        path: str,
        left: Any,
        right: Any,
        *,
        spec_id: str | None = None,
        shown: tuple[Any, Any] | None = None,
    ) -> None:
        """Add a divergence at ``path`` when its rule says the values differ (reported as
        ``shown`` when given, e.g. ``<absent>`` for a missing key)."""
        rule = rule_for(path)
        if rule.how != "exact" and (left is None or right is None):
            return
        if rule.how == "tolerance":
            slack = self.slack(rule)
            if slack is None or not abs(left - right) > slack:  # NaN: never beyond
                return
        elif left == right:
            return
        self.add(path, *(shown or (left, right)), spec_id=spec_id)

    def add(self, path: str, left: Any, right: Any, *, spec_id: str | None = None) -> None:
        """Add a divergence already decided (its kind from ``RULES``)."""
        kind = rule_for(path).kind
        if spec_id is not None:
            location = self.scenario.request_location(spec_id)
        elif path.startswith("startup"):
            location = self.scenario.location(("config",))
        else:
            location = self.scenario.location()
        self.record(kind, path, left, right, location)


def diff_serve_runs(scenario: Scenario, left: ServeRun, right: ServeRun) -> tuple[Divergence, ...]:
    """Every difference between two serve-tier runs of ``scenario`` (empty: parity)."""
    out = _Out(scenario, left, right)
    if not _diff_startup(out, left.startup, right.startup):
        return tuple(out.found)
    named = all("served_model_name" in run.startup.took for run in (left, right))
    for name in ("max_model_len", "model_id") if named else ("max_model_len",):
        out.compare(
            f"facts.{name}", getattr(left.facts, name, None), getattr(right.facts, name, None)
        )
    for rid, x_obs, y_obs in _pairs(left.observations, right.observations):
        _diff_request(out, scenario, rid, x_obs, y_obs)
    _diff_metrics(out, left, right)
    _diff_health(out, left, right)
    out.compare("shutdown.sigterm", left.sigterm, right.sigterm)
    return tuple(out.found)


# -- startup ------------------------------------------------------------------------------
def startup_value(record: StartupRecord) -> str:
    """``started``, or ``refused: <key line>`` (``startup_timeout: ...`` when it hung)."""
    if record.started:
        return "started"
    word = "refused" if record.outcome == "startup_refused" else record.outcome
    return f"{word}: {record.error}"


def _diff_startup(out: _Out, a: StartupRecord, b: StartupRecord) -> bool:
    """Compare startups; True when both started (the rest is comparable)."""
    if a.started != b.started:
        out.compare("startup", startup_value(a), startup_value(b))
        return False
    if not a.started:
        out.compare("startup.outcome", a.outcome, b.outcome)
        out.compare("startup.error_type", _error_type(a.error), _error_type(b.error))
    for key in STARTUP_NUMBERS:
        # both refused: the numbers are part of what each refusal says. Both started: a log
        # line a server does not print (a server that is not vLLM) says nothing about it.
        if not a.started or (key in a.numbers and key in b.numbers):
            out.compare(f"startup.numbers.{key}", a.numbers.get(key), b.numbers.get(key))
    return a.started


def _error_type(error: str | None) -> str | None:
    if not error:
        return None
    head = error.split(":", 1)[0].strip()
    return head if head.replace(".", "").replace("_", "").isalnum() else error


# -- requests -----------------------------------------------------------------------------
def _pairs(
    left: Iterable[RequestObservation], right: Iterable[RequestObservation]
) -> Iterator[tuple[str, RequestObservation | None, RequestObservation | None]]:
    by_left = {o.request_id: o for o in left}
    by_right = {o.request_id: o for o in right}
    for rid in _union(by_left, by_right):
        yield rid, by_left.get(rid), by_right.get(rid)


def _diff_request(
    out: _Out,
    scenario: Scenario,
    rid: str,
    a: RequestObservation | None,
    b: RequestObservation | None,
) -> None:
    spec_id = (a or b).spec_id  # type: ignore[union-attr]
    p = f"requests.{rid}"

    def compare(suffix: str, x: Any, y: Any, shown: tuple[Any, Any] | None = None) -> None:
        out.compare(f"{p}.{suffix}", x, y, spec_id=spec_id, shown=shown)

    if a is None or b is None:
        compare("outcome", a.outcome if a else None, b.outcome if b else None)
        return
    compare("outcome", a.outcome, b.outcome)
    if a.outcome != b.outcome:  # the rest is a consequence, but for an HTTP error's answer
        if "http_error" in (a.outcome, b.outcome):
            compare("status", a.status, b.status)
            _diff_error(compare, a, b)
        return
    compare("status", a.status, b.status)
    _diff_error(compare, a, b)
    compare("headers.content-type", a.headers.get("content-type"), b.headers.get("content-type"))
    markers = scenario.config.reasoning_parser is not None
    derived = _derived(a) or _derived(b)
    asked = _asked_ids(a) and _asked_ids(b)
    for name in RESULT_FIELDS:
        if name == "prompt_token_ids" and not asked:
            continue  # only a target asked for token ids sends them
        compare(
            name,
            _field(a, name, markers, derived=derived),
            _field(b, name, markers, derived=derived),
        )
    _diff_choices(compare, a, b, markers, derived)
    x_usage, y_usage = _flat(a.result.usage or {}), _flat(b.result.usage or {})
    for key in _union(x_usage, y_usage):
        shown = (x_usage.get(key, ABSENT), y_usage.get(key, ABSENT))
        compare(f"usage.{key}", x_usage.get(key), y_usage.get(key), shown)
    tolerance = out.slack(RULES["requests.logprobs"]) or 0.0
    for suffix, x, y in diff_logprobs(logprobs_of(a), logprobs_of(b), tolerance):
        out.add(
            f"{p}.logprobs{'' if suffix.startswith('[') else '.'}{suffix}", x, y, spec_id=spec_id
        )
    ignored = IGNORED_KEYS if asked or not (_asked_ids(a) or _asked_ids(b)) else HARNESS_KEYS
    if a.stream or b.stream:
        _diff_stream(compare, a, b, ignored)
    else:
        _diff_shape(compare, "body", _body_json(a), _body_json(b), ignored=ignored)
    for name in ("t_first_token_ms", "t_end_ms"):
        compare(name, getattr(a, name), getattr(b, name))


def _derived(observation: RequestObservation) -> bool:
    """Some token ids of this observation were tokenized from its text (parity.serve.derive)."""
    result = observation.result
    return result.token_ids_derived or any(c.token_ids_derived for c in result.other_choices)


def _asked_ids(observation: RequestObservation) -> bool:
    """The request asked the server for its token ids (``return_token_ids``)."""
    return bool(observation.request_body.get("return_token_ids"))


def _field(
    observation: RequestObservation,
    name: str,
    markers: bool,
    source: Any = None,
    *,
    derived: bool = False,
) -> Any:
    """A result field of choice 0 (or of ``source``, another choice); streamed reasoning
    without the ``<think>`` marker text (see the module docstring); token ids tokenized from
    the text on both sides when either side's are (``derived``: like for like)."""
    if name == "token_ids" and derived:
        name = "text_token_ids"
    value = getattr(source if source is not None else observation.result, name, None)
    if markers and observation.stream and name == "reasoning" and isinstance(value, str):
        return value.replace(THINK_START, "")
    return value


Compare = Callable[..., None]  # compare(suffix, left, right[, shown]) for one request


def _diff_choices(
    compare: Compare, a: RequestObservation, b: RequestObservation, markers: bool, derived: bool
) -> None:
    """The choices after the first (n > 1), matched by index."""
    x = {c.index: c for c in a.result.other_choices}
    y = {c.index: c for c in b.result.other_choices}
    for index in sorted(set(x) | set(y)):
        for name in CHOICE_FIELDS:
            left = _field(a, name, markers, x[index], derived=derived) if index in x else None
            right = _field(b, name, markers, y[index], derived=derived) if index in y else None
            compare(f"choices[{index}].{name}", left, right)


def _diff_error(compare: Compare, a: RequestObservation, b: RequestObservation) -> None:
    x, y = a.result.error or {}, b.result.error or {}
    if not x and not y:
        return
    if bool(x) != bool(y):
        compare("error", x or None, y or None)
        return
    for key in _union({k: 1 for k in ERROR_KEYS if k in x}, {k: 1 for k in ERROR_KEYS if k in y}):
        # null and absent are the same; an absent one is shown as <absent>
        compare(f"error.{key}", x.get(key), y.get(key), (x.get(key, ABSENT), y.get(key, ABSENT)))


def _diff_stream(
    compare: Compare, a: RequestObservation, b: RequestObservation, ignored: frozenset[str]
) -> None:
    compare("done", a.done, b.done)
    compare("frames", list(frame_kinds(a)), list(frame_kinds(b)))
    _diff_shape(
        compare,
        "frames",
        _frame_payloads(a),
        _frame_payloads(b),
        values=FRAME_VALUE_KEYS,
        ignored=ignored,
    )


def frame_kinds(observation: RequestObservation) -> tuple[str, ...]:
    """The event sequence of a stream, independent of chunk boundaries: each frame's kind
    split into its parts (``delta+finish`` is a delta, then a finish), frames with no text,
    role, finish or usage dropped, and every run of deltas written ``delta*``. What counts is
    the order of role, deltas, finish, usage, error and ``[DONE]``. With several choices
    (``n > 1``) their frames interleave as the server's steps go, so each choice's events are
    taken on their own and the sequences follow in index order, then the frames that carry no
    choice (usage, error, ``[DONE]``)."""
    if len(_choice_indexes(observation)) > 1:
        return _per_choice_kinds(observation)
    parts: list[str] = []
    for frame in observation.frames:
        parts.extend(_parts(frame))
    return _collapse(parts)


def _parts(frame: Any, payload: Any = None) -> list[str]:
    if frame.done:
        return ["done"]
    if frame.data is None:
        return ["comment"]
    payload = frame.payload() if payload is None else payload
    kind = frame_kind(payload if payload is not None else {"raw": frame.data})
    return [part for part in kind.split("+") if part != "empty"]


def _collapse(parts: Iterable[str]) -> tuple[str, ...]:
    events: list[str] = []
    for part in parts:
        if part == "delta":
            if events and events[-1] == "delta*":
                continue
            part = "delta*"
        events.append(part)
    return tuple(events)


def _choice_indexes(observation: RequestObservation) -> set[int]:
    found = set()
    for payload in _frame_payloads(observation):
        for choice in payload.get("choices") or () if isinstance(payload, dict) else ():
            if isinstance(choice, dict):
                found.add(int(choice.get("index", 0)))
    return found


def _per_choice_kinds(observation: RequestObservation) -> tuple[str, ...]:
    streams: dict[int, list[str]] = {}
    rest: list[str] = []
    for frame in observation.frames:
        payload = frame.payload()
        choices = payload.get("choices") if isinstance(payload, dict) else None
        if not choices:
            rest.extend(_parts(frame))
            continue
        for choice in choices:
            index = int(choice.get("index", 0)) if isinstance(choice, dict) else 0
            one = {**payload, "choices": [choice]}
            streams.setdefault(index, []).extend(_parts(frame, one))
    events: list[str] = []
    for index in sorted(streams):
        events.extend(_collapse(streams[index]))
    return tuple(events) + _collapse(rest)


def _frame_payloads(observation: RequestObservation) -> list[Any]:
    return [p for p in (f.payload() for f in observation.frames) if p is not None]


def _body_json(observation: RequestObservation) -> Any:
    if observation.body is None:
        return None
    try:
        return json.loads(observation.body)
    except ValueError:
        return None


def _diff_shape(
    compare: Compare,
    prefix: str,
    x: Any,
    y: Any,
    *,
    values: frozenset[str] | None = None,
    ignored: frozenset[str] = IGNORED_KEYS,
) -> None:
    """Keys present on one side only, and values of uncovered scalar fields that differ."""
    xs, ys = key_shape(x, values, ignored), key_shape(y, values, ignored)
    for key in _union(xs, ys):
        compare(f"{prefix}.{key}", xs.get(key, ABSENT), ys.get(key, ABSENT))


def key_shape(
    data: Any, values: frozenset[str] | None = None, ignored: frozenset[str] = IGNORED_KEYS
) -> dict[str, Any]:
    """``{dotted key path: value}`` of a JSON document: list indices collapsed to ``[]``,
    ``null`` dropped (null and absent are the same), ignored keys (ids, created, fingerprint)
    dropped, covered keys (text, usage, logprobs, ...) kept as ``<present>`` only. Scalar
    values are kept (as a sorted list of the values seen under that path) when ``values`` is
    None or the key is in ``values``; otherwise ``<present>``."""
    found: dict[str, set[str]] = {}
    _walk(data, "", found, values, ignored)
    return {key: sorted(seen) if seen else "<present>" for key, seen in found.items()}


def _walk(
    node: Any,
    path: str,
    found: dict[str, set[str]],
    values: frozenset[str] | None,
    ignored: frozenset[str],
) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if value is None or key in ignored:
                continue
            child = f"{path}.{key}" if path else str(key)
            if key in COVERED_KEYS:
                found.setdefault(child, set())
                continue
            _walk(value, child, found, values, ignored)
            if isinstance(value, dict | list):
                continue
            seen = found.setdefault(child, set())
            if values is None or key in values:
                seen.add(json.dumps(value))
    elif isinstance(node, list):
        for item in node:
            _walk(item, f"{path}[]", found, values, ignored)


# -- logprobs -----------------------------------------------------------------------------
def logprobs_of(observation: RequestObservation) -> list[dict[str, Any]] | None:
    """Choice 0's logprobs as ``[{token, logprob, top: [[token, logprob], ...]}]`` (None: not
    returned), from the body or accumulated over the stream's frames; completions'
    (``tokens``/``token_logprobs``/``top_logprobs``) and chat's (``content``) shapes alike."""
    if observation.stream:
        choices = [_choice0(p) for p in _frame_payloads(observation)]
    else:
        body = _body_json(observation)
        choices = [_choice0(body)] if isinstance(body, dict) else []
    entries: list[dict[str, Any]] | None = None
    for choice in choices:
        block = choice.get("logprobs") if choice else None
        if not isinstance(block, dict):
            continue
        entries = (entries or []) + _entries(block)
    return entries


def _choice0(payload: Any) -> dict[str, Any] | None:
    if not isinstance(payload, dict):
        return None
    for choice in payload.get("choices") or ():
        if isinstance(choice, dict) and int(choice.get("index", 0)) == 0:
            return choice
    return None


def _entries(block: dict[str, Any]) -> list[dict[str, Any]]:
    if isinstance(block.get("content"), list):  # chat
        return [
            {
                "token": item.get("token"),
                "logprob": item.get("logprob"),
                "top": [[t.get("token"), t.get("logprob")] for t in item.get("top_logprobs") or ()],
            }
            for item in block["content"]
        ]
    tokens = block.get("tokens") or []
    values = block.get("token_logprobs") or [None] * len(tokens)
    tops = block.get("top_logprobs") or [None] * len(tokens)
    offsets = block.get("text_offset") or [None] * len(tokens)
    return [
        {"token": t, "logprob": v, "top": [[k, w] for k, w in (top or {}).items()], "offset": o}
        for t, v, top, o in zip(tokens, values, tops, offsets, strict=False)
    ]


def diff_logprobs(
    x: list[dict[str, Any]] | None, y: list[dict[str, Any]] | None, tolerance: float
) -> list[tuple[str, Any, Any]]:
    """``(path suffix, left, right)`` for logprobs that differ: presence, length, then the first
    position whose token, text offset, top-token order (ranks, exact) or values (beyond
    ``tolerance``) differ."""
    if x is None or y is None:
        return [] if x is y else [("present", x is not None, y is not None)]
    found: list[tuple[str, Any, Any]] = []
    if len(x) != len(y):
        found.append(("length", len(x), len(y)))
    for index, (a, b) in enumerate(zip(x, y, strict=False)):
        here = f"[{index}]"
        if a.get("token") != b.get("token"):
            found.append((f"{here}.token", a.get("token"), b.get("token")))
        if a.get("offset") != b.get("offset"):
            found.append((f"{here}.text_offset", a.get("offset"), b.get("offset")))
        if not _close(a.get("logprob"), b.get("logprob"), tolerance):
            found.append((f"{here}.logprob", a.get("logprob"), b.get("logprob")))
        ranks_a, ranks_b = [t for t, _ in a["top"]], [t for t, _ in b["top"]]
        if ranks_a != ranks_b:
            found.append((f"{here}.top_logprobs.ranks", ranks_a, ranks_b))
        elif not all(
            _close(p, q, tolerance) for (_, p), (_, q) in zip(a["top"], b["top"], strict=True)
        ):
            found.append((f"{here}.top_logprobs.values", a["top"], b["top"]))
        if len(found) > 1 or (found and not found[0][0] == "length"):
            break  # the first differing position is the finding; later ones follow from it
    return found


def _close(a: Any, b: Any, tolerance: float) -> bool:
    if a is None or b is None:
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        if math.isinf(a) or math.isinf(b):
            return a == b
        return abs(a - b) <= tolerance
    return bool(a == b)


# -- metrics, health ----------------------------------------------------------------------
def metric_deltas(run: ServeRun) -> dict[str, float] | None:
    """The change of the compared metrics over the run (None: no snapshots)."""
    before, after = run.metrics_before, run.metrics_after
    if before is None or after is None or before.error or after.error:
        return None
    found: dict[str, float] = {}
    for key, value in after.samples.items():
        if key.startswith(METRIC_PREFIXES):
            delta = value - before.samples.get(key, 0.0)
            found[key] = int(delta) if float(delta).is_integer() else round(delta, 6)
    return found


def _diff_metrics(out: _Out, left: ServeRun, right: ServeRun) -> None:
    x, y = metric_deltas(left), metric_deltas(right)
    if x is None or y is None:
        return
    for key in _union(x, y):
        out.compare(f"metrics_after.{key}", x.get(key, 0), y.get(key, 0))


def _diff_health(out: _Out, left: ServeRun, right: ServeRun) -> None:
    # statuses answered (a sample without an answer is load on this machine, not a finding;
    # a dead server shows in server_alive_after and the request outcomes)
    x = sorted({h.status for h in left.health if h.status is not None})
    y = sorted({h.status for h in right.health if h.status is not None})
    out.compare("health.statuses", x, y)
    out.compare("health.server_alive_after", left.server_alive_after, right.server_alive_after)


# -- helpers ------------------------------------------------------------------------------
def _union(a: Iterable[str], b: Iterable[str]) -> list[str]:
    keys = list(a)
    return keys + [key for key in b if key not in keys]


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if value is None:
            continue
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flat(value, name + "."))
        else:
            flat[name] = value
    return flat
