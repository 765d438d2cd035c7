"""Rules 1-2: ``capacity_overhang`` (startup and auto-fit one block apart) and ``shutdown``
(see ``parity.signatures`` for the rules)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from parity.signatures.facts import Facts, advertised, as_int

_ESTIMATE = re.compile(r"estimated maximum model length is (\d+)")
_NO_MEMORY = ("No available memory for the cache blocks", "Cannot auto-fit")


# -- 1. capacity_overhang ------------------------------------------------------------------
def capacity(f: Facts) -> str | None:
    records = [_startup_record(side) for side in f.sides]
    if f.anchor == "startup" or f.div.kind == "startup":
        found = _overhang_refusal(f, f.values) or _overhang_refusal(f, records)
        if found:
            return found
        found = _refusals_a_block_apart(f, records)
        if found:
            return found
    if f.last.endswith("max_model_len") and f.rid is None:
        left, right = (as_int(v) for v in f.values)
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


def _overhang_refusal(f: Facts, values: Sequence[Any]) -> str | None:
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
        shown = started[0][2]
        if shown is None:
            shown = next((advertised(s) for s in f.sides if advertised(s) is not None), None)
        if estimate is not None and shown is not None and shown - estimate == bs:
            return f"C1: refused with estimate {estimate}, the other advertises {shown}"
        return None
    if estimate is not None and estimate == (n - 1) * bs:
        return f"C1: refused with estimate {estimate} = ({n}-1)*{bs}; the other started"
    limit = as_int(f.ctx.config.get("max_model_len"))
    if limit is not None and limit > 0 and math.ceil(limit / bs) == n:
        return f"C1: max_model_len {limit} needs {n} blocks, {n - 1} usable; one side started"
    if n == 1 and any(phrase in text for phrase in _NO_MEMORY):
        return "C1: one block (the null block) only; one side started"
    return None


def _refusals_a_block_apart(f: Facts, records: Sequence[Any]) -> str | None:
    """C4: both refused; one planned with N-1 usable blocks, the other with all N."""
    states = [_startup_state(r) for r in records]
    n, bs = f.num_blocks, f.bs
    if n is None or any(s[0] != "refused" for s in states):
        return None
    kinds: list[str | None] = []
    for _state, text, _listed, number in states:
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
        length = as_int(value.get("max_model_len"))
        if length is None:
            length = as_int(numbers.get("auto_fit_max_model_len"))
        outcome = value.get("outcome", value.get("status", value.get("started")))
        text = str(value.get("error") or value.get("message") or value.get("log_tail") or "")
        state = _startup_state(outcome)[0] if outcome is not None else None
        text = text or (str(outcome) if state == "refused" else "")
        return (state, text, length, as_int(numbers.get("estimated_max_model_len")))
    return (None, "", None, None)


def _startup_record(side: Mapping[str, Any]) -> Any:
    record = side.get("startup")
    if record is not None:
        return record
    if "started" in side:
        return {"started": side["started"], "error": side.get("error")}
    return None


# -- 2. shutdown ---------------------------------------------------------------------------
def shutdown(f: Facts) -> str | None:
    if f.anchor == "shutdown" or f.div.kind == "shutdown":
        return f"D: shutdown {f.values[0]!r} vs {f.values[1]!r}"
    return None
