"""The block pool (engine/core/block_pool.py): unit cases and a hypothesis state machine."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from engine.core.block_pool import BlockPool
from engine.core.kv_cache_utils import KVCacheBlock

pytestmark = pytest.mark.timeout(120)


def _holder(hashes: list[bytes]) -> SimpleNamespace:
    """Enough of a Request for ``cache_full_blocks``: its block hashes."""
    return SimpleNamespace(block_hashes=hashes)


def test_null_block_is_reserved_and_usage_excludes_it() -> None:
    pool = BlockPool(5, enable_caching=True)
    assert pool.null_block.block_id == 0 and pool.null_block.is_null
    assert pool.get_num_free_blocks() == 4 and pool.free_block_ids() == [1, 2, 3, 4]
    blocks = pool.get_new_blocks(3)
    assert [b.block_id for b in blocks] == [1, 2, 3]
    assert pool.get_usage() == pytest.approx(0.75)
    with pytest.raises(ValueError):
        pool.get_new_blocks(2)


def test_free_puts_unhashed_first_and_hashed_last() -> None:
    pool = BlockPool(6, enable_caching=True)
    blocks = pool.get_new_blocks(3)  # 1, 2, 3
    pool.cache_full_blocks(_holder([b"h1", b"h2"]), blocks, 0, 2)  # 1 and 2 cached
    pool.free_blocks(reversed(blocks))  # 3 (unhashed) first, then 2, 1 (hashed) last
    assert pool.free_block_ids() == [3, 4, 5, 2, 1]


def test_free_without_caching_is_lifo() -> None:
    pool = BlockPool(5, enable_caching=False)
    blocks = pool.get_new_blocks(2)
    pool.free_blocks(reversed(blocks))
    assert pool.free_block_ids() == [2, 1, 3, 4]


def test_reuse_evicts_hash_and_touch_unlinks_free_block() -> None:
    pool = BlockPool(4, enable_caching=True)
    (block,) = pool.get_new_blocks(1)
    pool.cache_full_blocks(_holder([b"h"]), [block], 0, 1)
    pool.free_blocks([block])
    assert pool.get_cached_block(b"h") is block and pool.free_block_ids() == [2, 3, 1]
    pool.touch([block])
    assert block.ref_cnt == 1 and pool.free_block_ids() == [2, 3]
    pool.free_blocks([block])
    got = pool.get_new_blocks(3)
    assert [b.block_id for b in got] == [2, 3, 1]
    assert block.block_hash is None and pool.get_cached_block(b"h") is None


def test_duplicate_blocks_are_not_deduplicated_first_cached_wins() -> None:
    pool = BlockPool(4, enable_caching=True)
    a, b = pool.get_new_blocks(2)
    pool.cache_full_blocks(_holder([b"same"]), [a], 0, 1)
    pool.cache_full_blocks(_holder([b"same"]), [b], 0, 1)
    assert pool.get_cached_block(b"same") is a
    pool.free_blocks([a])
    pool.get_new_blocks(2)  # 3, then a (evicted from the cache)
    assert pool.get_cached_block(b"same") is b


class BlockPoolMachine(RuleBasedStateMachine):
    """Owners take, touch and free blocks; a list models the expected free-queue order."""

    owners = Bundle("owners")

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(9, enable_caching=True)
        self.model_free = list(range(1, 9))  # expected eviction order, head first
        self.held: dict[int, list[KVCacheBlock]] = {}
        self.next_owner = 0
        self.next_hash = 0
        self.cached: dict[bytes, list[int]] = {}  # hash -> block ids in caching order

    def _new_owner(self, blocks: list[KVCacheBlock]) -> int:
        self.next_owner += 1
        self.held[self.next_owner] = blocks
        return self.next_owner

    @rule(target=owners, n=st.integers(0, 4))
    def allocate(self, n: int) -> int:
        if n > self.pool.get_num_free_blocks():
            with pytest.raises(ValueError):
                self.pool.get_new_blocks(n)
            return self._new_owner([])
        blocks = self.pool.get_new_blocks(n)
        expected, self.model_free = self.model_free[:n], self.model_free[n:]
        assert [b.block_id for b in blocks] == expected
        for block in blocks:
            for ids in self.cached.values():
                if block.block_id in ids:
                    ids.remove(block.block_id)
        return self._new_owner(blocks)

    @rule(owner=owners, data=st.data())
    def cache_some(self, owner: int, data: st.DataObject) -> None:
        blocks = self.held[owner]
        uncached = [b for b in blocks if b.block_hash is None]
        if not uncached:
            return
        block = data.draw(st.sampled_from(uncached))
        key = data.draw(st.sampled_from([b"dup", f"h{self.next_hash}".encode()]))
        self.next_hash += 1
        self.pool.cache_full_blocks(_holder([key]), [block], 0, 1)
        self.cached.setdefault(key, []).append(block.block_id)

    @precondition(lambda self: bool(self.cached))
    @rule(target=owners, data=st.data())
    def touch_hit(self, data: st.DataObject) -> int:
        key = data.draw(st.sampled_from(sorted(self.cached)))
        block = self.pool.get_cached_block(key)
        ids = self.cached[key]
        assert (block.block_id if block else None) == (ids[0] if ids else None)
        if block is None:
            return self._new_owner([])
        if block.ref_cnt == 0:
            self.model_free.remove(block.block_id)
        self.pool.touch([block])
        return self._new_owner([block])

    @rule(owner=consumes(owners))
    def free(self, owner: int) -> None:
        blocks = self.held.pop(owner)
        self.pool.free_blocks(reversed(blocks))
        first = []
        last = []
        for block in reversed(blocks):
            if block.ref_cnt == 0:
                (last if block.block_hash is not None else first).append(block.block_id)
        self.model_free = first + self.model_free + last

    @invariant()
    def accounting(self) -> None:
        refs: dict[int, int] = {}
        for blocks in self.held.values():
            for block in blocks:
                refs[block.block_id] = refs.get(block.block_id, 0) + 1
        free_ids = self.pool.free_block_ids()
        assert free_ids == self.model_free
        assert len(free_ids) == len(set(free_ids)) == self.pool.get_num_free_blocks()
        assert not set(free_ids) & set(refs), "a block is both free and held"
        assert len(free_ids) + len(refs) == self.pool.num_gpu_blocks - 1
        for block in self.pool.blocks[1:]:
            assert block.ref_cnt == refs.get(block.block_id, 0) >= 0


def test_block_pool_state_machine() -> None:
    run_state_machine_as_test(
        BlockPoolMachine,
        settings=settings(max_examples=150, stateful_step_count=40, deadline=None),
    )
