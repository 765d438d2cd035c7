"""Rules 3-4: ``self_preemption_wedge`` and ``max_tokens_clamp``, the request-level classes
(see ``parity.signatures`` for the rules)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from parity.signatures.facts import (
    FINISHED,
    MAX_TOKENS_PARAMS,
    STATUS_FIELDS,
    WEDGED,
    Facts,
    as_int,
    as_number,
    dig,
    first_of,
)


# -- 3. self_preemption_wedge --------------------------------------------------------------
def wedge(f: Facts) -> str | None:
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


def _wedged_alone(f: Facts, side: Mapping[str, Any], rid: str) -> str | None:
    obs = f.observation(side, rid)
    if obs.get("outcome") not in WEDGED:
        return None
    preemptions = as_int(obs.get("num_preemptions"))
    if preemptions is not None and preemptions < 1:
        return None
    record = side.get("wedge")
    if isinstance(record, Mapping):
        if not record.get("running") and rid in (record.get("stuck") or ()):
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


def clamp(f: Facts) -> str | None:
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
    refused = _context_rejection(f, f.rid)
    if refused is not None:
        return refused
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


def _counts(f: Facts, headroom: int) -> tuple[int, int] | None:
    left, right = f.values
    if f.last in _ID_FIELDS and isinstance(left, list | tuple) and isinstance(right, list | tuple):
        return len(left), len(right)
    numbers = (as_int(left), as_int(right))
    if numbers[0] is None or numbers[1] is None:
        return None
    if f.last in _COUNT_FIELDS or f.last == "max_tokens" or f.last.endswith("_max_tokens"):
        return numbers[0], numbers[1]
    if f.last == "total_tokens":
        prompt = f.prompt_len(f.rid or "")
        return None if prompt is None else (numbers[0] - prompt, numbers[1] - prompt)
    return None


def _clamp_metric(f: Facts) -> str | None:
    if not f.ctx.requests or f.last.endswith(("count", "_bucket")) or "le=" in f.div.path:
        return None
    totals = [0, 0]
    for rid in f.ctx.requests:
        terms = f.clamp(rid)
        if terms is None or terms[1] is None:
            return None
        repeat = as_int(f.spec(rid).get("repeat")) or 1
        totals[0] += terms[2] * repeat
        totals[1] += terms[1] * repeat
    values = {as_number(v) for v in f.values}
    if totals[0] != totals[1] and values == set(totals):
        return f"M4: request_params_max_tokens {totals[0]} clamped vs {totals[1]} requested"
    return None


def _max_tokens_error(f: Facts, index: int) -> str | None:
    value = f.values[index]
    param = None
    if f.last == "param" and isinstance(value, str):
        param = value
    elif isinstance(value, Mapping):
        param = _error_param(value)
    if param is None and f.rid is not None:
        param = _error_param(f.observation(f.sides[index], f.rid))
    return param if param in MAX_TOKENS_PARAMS else None


def _errored(f: Facts, index: int) -> bool:
    if _max_tokens_error(f, index) is not None:
        return True
    obs = f.observation(f.sides[index], f.rid or "")
    value = f.values[index]
    status = as_int(value) if f.last in STATUS_FIELDS else as_int(first_of(obs, _STATUS_KEYS))
    return (
        obs.get("outcome") == "http_error"
        or value == "http_error"
        or ("error" in f.names and value is not None)
        or (status is not None and status >= 400)
        or _error_param(obs) is not None
    )


def _error_param(obs: Mapping[str, Any]) -> str | None:
    for candidate in (obs.get("error"), dig(obs, ("result", "error")), obs):
        if isinstance(candidate, Mapping):
            inner = candidate.get("error")
            body = inner if isinstance(inner, Mapping) else candidate
            param = body.get("param")
            if isinstance(param, str):
                return param
    return None


_STATUS_KEYS = (("status",), ("status_code",), ("http_status",))

# "maximum context length is 96 tokens. However, you requested 16 output tokens and your
# prompt contains ..." (renderer length check before the clamp existed there); older wording:
# "... you requested 106 tokens (90 in the messages, 16 in the completion)".
_CONTEXT = re.compile(r"maximum context length is (\d+) tokens", re.IGNORECASE)
_REQUESTED = re.compile(r"you requested (\d+) output tokens|(\d+) in the completion", re.IGNORECASE)


def _context_rejection(f: Facts, rid: str) -> str | None:
    """M5: one side's 400 says prompt plus requested output tokens exceed the context length,
    the other completed cut at ``length`` with fewer tokens than requested (it clamped)."""
    for rejecting, completing in ((0, 1), (1, 0)):
        found = _rejection_numbers(f, rid, rejecting)
        if found is None:
            continue
        context, requested = found
        limit = f.max_model_len()
        if limit is not None and limit != context:
            continue
        other = f.observation(f.sides[completing], rid)
        if other.get("outcome") not in ("completed", "finished"):
            continue
        if first_of(other, (("result", "finish_reason"), ("finish_reason",))) != "length":
            continue
        produced = as_int(first_of(other, _OUTPUT_KEYS))
        if produced is not None and produced >= requested:
            continue
        got = "" if produced is None else f" after {produced}"
        return (
            f"M5: one side refused {requested} output tokens at context length {context}, "
            f"the other clamped (length{got})"
        )
    return None


_OUTPUT_KEYS = (
    *(("result", "usage", "completion_tokens"), ("usage", "completion_tokens")),
    ("num_output_tokens",),
)


def _rejection_numbers(f: Facts, rid: str, index: int) -> tuple[int, int] | None:
    """``(M, T)`` named by side ``index``'s error message (the observation's or the value)."""
    obs = f.observation(f.sides[index], rid)
    texts = [f.values[index]] if f.last == "message" else []
    for candidate in (obs.get("error"), dig(obs, ("result", "error"))):
        if isinstance(candidate, Mapping):
            inner = candidate.get("error")
            body = inner if isinstance(inner, Mapping) else candidate
            texts.append(body.get("message"))
    for text in texts:
        if not isinstance(text, str):
            continue
        context, requested = _CONTEXT.search(text), _REQUESTED.search(text)
        if context and requested:
            return int(context.group(1)), int(requested.group(1) or requested.group(2))
    return None
