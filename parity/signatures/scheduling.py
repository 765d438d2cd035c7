"""Rule 11: ``prefill_chunking``, a scheduler step where one side capped a prefill chunk at
``long_prefill_token_threshold`` and the other scheduled more (see ``parity.signatures``).

Upstream 0.32.0 applies the threshold only while more than one request is eligible (running
plus waiting, ``v1/core/sched/scheduler.py:640-649``); earlier releases cap every prefill
chunk (0.28.0 ``scheduler.py:563-564``), so a long prompt arriving alone is chunked on one and
computed whole on the other.
"""

from __future__ import annotations

from parity.signatures.facts import Facts, as_int


def chunking(f: Facts) -> str | None:
    if f.anchor != "steps" or "num_scheduled_tokens" not in f.names or f.rid is None:
        return None
    threshold = as_int(f.ctx.config.get("long_prefill_token_threshold"))
    if not threshold or threshold <= 0:
        return None
    left, right = (as_int(v) for v in f.values)
    if left is None or right is None:
        return None
    prompt = f.prompt_len(f.rid)
    for capped, whole in ((left, right), (right, left)):
        if capped == threshold < whole and (prompt is None or whole <= prompt):
            return (
                f"P: {f.rid} prefill chunk capped at long_prefill_token_threshold {threshold} "
                f"on one side, {whole} on the other"
            )
    return None
