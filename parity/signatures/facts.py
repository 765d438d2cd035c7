"""The facts a signature rule reads: path splitting, the request a path is about, and
``Facts`` (one divergence with its ``SignatureContext``, read once). See ``parity.signatures``
for the rules and what each number means.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from parity.results import Divergence

ANCHORS = frozenset(
    {"steps", "outcomes", "requests", "observations", "startup", "models", "facts", "health"}
    | {"metrics", "metrics_before", "metrics_after", "shutdown", "timing", "wedge", "error"}
    | {"num_steps"}
)
SERVER_ANCHORS = frozenset({"startup", "models", "facts"})
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
STATUS_FIELDS = frozenset({"status", "status_code", "http_status"})


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
        data = plain(scenario) or {}
        requests = {str(r["id"]): r for r in data.get("requests") or () if isinstance(r, Mapping)}
        return cls(data.get("config") or {}, requests, plain(left) or {}, plain(right) or {})


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
    return request_in(anchored(split_path(path)), request_ids)


class Facts:
    """One divergence with its context, read once."""

    def __init__(self, divergence: Divergence, context: SignatureContext) -> None:
        self.div = divergence
        self.ctx = context
        self.tail = anchored(split_path(divergence.path))
        self.anchor = self.tail[0] if self.tail else ""
        names = [s for s in self.tail if not s.startswith("[")]
        self.last = names[-1] if names else ""
        self.names = frozenset(names)
        self.sides = (context.left, context.right)
        self.values = (divergence.left, divergence.right)
        self.rid = request_in(self.tail, list(context.requests))
        if self.rid is None:
            self.rid = observation_id(self.tail, self.sides)
        self.bs = as_int(context.config.get("block_size")) or 16
        self.num_blocks = as_int(context.config.get("num_gpu_blocks_override"))

    @property
    def run_level(self) -> bool:
        return self.rid is None and self.anchor not in SERVER_ANCHORS

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
        seen = {prompt_of(self.observation(s, rid)) for s in self.sides} - {None}
        return seen.pop() if len(seen) == 1 else None

    def max_model_len(self) -> int | None:
        configured = as_int(self.ctx.config.get("max_model_len"))
        if configured is not None and configured > 0:
            return configured
        seen = {advertised(side) for side in self.sides} - {None}
        return seen.pop() if len(seen) == 1 else None

    def clamp(self, rid: str) -> tuple[int, int | None, int] | None:
        """``(M - P, T, C)`` for the request, or None when P or M is unknown."""
        prompt, limit = self.prompt_len(rid), self.max_model_len()
        if prompt is None or limit is None:
            return None
        spec = self.spec(rid)
        requested = as_int(spec.get("max_tokens"))
        if requested is None:
            requested = as_int(spec.get("max_completion_tokens"))
        if requested is None and endpoint_of(spec) == "completions":
            requested = 16
        headroom = limit - prompt
        return headroom, requested, headroom if requested is None else min(headroom, requested)


PROMPT_KEYS = (
    *(("usage", "prompt_tokens"), ("result", "usage", "prompt_tokens")),
    *(("prompt_tokens",), ("num_prompt_tokens",)),
)


def prompt_of(obs: Mapping[str, Any]) -> int | None:
    for path in (("prompt_token_ids",), ("result", "prompt_token_ids")):
        ids = dig(obs, path)
        if isinstance(ids, list | tuple) and ids:
            return len(ids)
    return as_int(first_of(obs, PROMPT_KEYS))


ADVERTISED = (
    *(("max_model_len",), ("facts", "max_model_len"), ("models", "max_model_len")),
    *(("startup", "max_model_len"), ("startup", "numbers", "auto_fit_max_model_len")),
)


def advertised(side: Mapping[str, Any]) -> int | None:
    for path in ADVERTISED:
        value = as_int(dig(side, path))
        if value is not None:
            return value
    return None


# -- values --------------------------------------------------------------------------------
def anchored(segments: tuple[str, ...]) -> tuple[str, ...]:
    for index, segment in enumerate(segments):
        if segment in ANCHORS:
            return segments[index:]
    return segments


def request_in(tail: Sequence[str], request_ids: Sequence[str]) -> str | None:
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


def observation_id(tail: Sequence[str], sides: Sequence[Mapping[str, Any]]) -> str | None:
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


def endpoint_of(spec: Mapping[str, Any]) -> str:
    endpoint = spec.get("endpoint")
    if endpoint:
        return str(endpoint)
    return "chat" if spec.get("messages") else "completions"


def as_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if float(value).is_integer() else None


def as_number(value: Any) -> int | float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if float(value).is_integer() else value


def dig(data: Any, path: Sequence[str]) -> Any:
    for key in path:
        if not isinstance(data, Mapping):
            return None
        data = data.get(key)
    return data


def first_of(data: Mapping[str, Any], paths: Sequence[Sequence[str]]) -> Any:
    for path in paths:
        value = dig(data, path)
        if value is not None:
            return value
    return None


def plain(value: Any) -> Any:
    if value is None or isinstance(value, Mapping):
        return value
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if hasattr(value, "to_json"):
        return value.to_json()
    raise TypeError(f"cannot read {type(value).__name__} as a plain dict")
