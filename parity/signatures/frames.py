"""Rules 5-9: ``reasoning_budget``, ``error_shape``, ``sse_framing``, ``metrics``, ``timing``,
and the SSE frame kinds (see ``parity.signatures`` for the rules)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from parity.signatures.facts import (
    FRAME_COUNTS,
    FRAME_SEGMENTS,
    FRAME_STRUCTURE,
    REASONING_FIELDS,
    STATUS_FIELDS,
    TEXT_FIELDS,
    Facts,
    endpoint_of,
)

_KIND_NAME = re.compile(
    r"(?:role|delta\*?|finish|usage|error|done|comment|empty|raw)"
    r"(?:\+(?:role|delta|finish|usage))*"
)


# -- 5. reasoning_budget -------------------------------------------------------------------
def reasoning(f: Facts) -> str | None:
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


def _is_chat(f: Facts) -> bool:
    if f.rid is None:
        return False
    if endpoint_of(f.spec(f.rid)) == "chat" and f.spec(f.rid):
        return True
    return any(f.observation(side, f.rid).get("endpoint") == "chat" for side in f.sides)


# -- 6. error_shape ------------------------------------------------------------------------
def error_shape(f: Facts) -> str | None:
    if f.rid is None:
        return None
    if "error" in f.names:
        return "E: error body"
    if f.last in STATUS_FIELDS:
        return f"E: {f.last}"
    if f.last == "outcome" and "http_error" in f.values:
        return "E: http_error on one side"
    if any(isinstance(v, Mapping) and "error" in v for v in f.values):
        return "E: an error body"
    return None


# -- 7. sse_framing ------------------------------------------------------------------------
def framing(f: Facts) -> str | None:
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
def metrics(f: Facts) -> str | None:
    if f.anchor.startswith("metrics") or any(s.startswith("vllm:") for s in f.tail):
        return "X: metric"
    return None


def timing(f: Facts) -> str | None:
    if f.div.kind == "timing" or f.anchor == "timing" or "latency" in f.names:
        return "T: timing"
    if f.last == "outcome" and "timeout" in f.values:
        return "T: timeout (still progressing) on one side"
    if f.last.endswith(("_s", "_ms")):
        return f"T: duration {f.last}"
    if f.anchor == "health" and _only_unavailable_apart(f.values):
        return "T: health polls differ only in a 503 (a server starting or dying) one side saw"
    return None


def _only_unavailable_apart(values: tuple[Any, Any]) -> bool:
    """Two health status lists equal once the 503s are left out: whether a poll lands in the
    window where the API server is up but its engine is not (starting or dead) is timing."""
    if not all(isinstance(v, list | tuple) for v in values):
        return False
    kept = [[s for s in v if s != 503] for v in values]
    return kept[0] == kept[1] and list(values[0]) != list(values[1])
