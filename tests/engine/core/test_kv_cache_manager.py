"""Prefix lookup, allocate_slots and free (engine/core/kv_cache_manager.py)."""

from __future__ import annotations

from typing import Any

import pytest

from engine.core.kv_cache_manager import KVCacheManager
from engine.core.kv_cache_utils import get_request_block_hasher
from engine.request import Request, RequestStatus

pytestmark = pytest.mark.timeout(30)


def _manager(num_blocks: int = 10, block_size: int = 4, **kwargs: object) -> KVCacheManager:
    return KVCacheManager(num_blocks, block_size, max_model_len=64, **kwargs)  # type: ignore[arg-type]


def _request(factories: Any, rid: str, tokens: list[int], block_size: int = 4) -> Request:
    request = factories.make_request(rid, tokens, 16)
    request.set_block_hasher(get_request_block_hasher(block_size))
    return request


def _snapshot(manager: KVCacheManager) -> tuple[object, ...]:
    pool = manager.block_pool
    return (
        pool.free_block_ids(),
        [b.ref_cnt for b in pool.blocks],
        [b.block_hash for b in pool.blocks],
        {k: list(v) for k, v in manager.req_to_blocks.items()},
        dict(manager.num_cached_block),
    )


def test_hit_is_capped_at_num_tokens_minus_one(factories: Any) -> None:
    manager = _manager()
    first = _request(factories, "a", list(range(8)))
    assert manager.allocate_slots(first, 8) is not None
    manager.free(first)
    same = _request(factories, "b", list(range(8)))
    hits, num_hit_tokens = manager.get_computed_blocks(same)
    assert num_hit_tokens == 4 and len(hits) == 1  # 8 tokens cached, at most 7 may hit
    longer = _request(factories, "c", list(range(9)))
    assert manager.get_computed_blocks(longer)[1] == 8


def test_failed_allocation_changes_nothing(factories: Any) -> None:
    manager = _manager(num_blocks=4)  # 3 usable blocks
    holder = _request(factories, "a", list(range(8)))
    assert manager.allocate_slots(holder, 8) is not None
    manager.free(holder)
    big = _request(factories, "b", list(range(8)) + [90] * 8)
    hits, num_hit = manager.get_computed_blocks(big)
    assert num_hit == 8
    before = _snapshot(manager)
    assert (
        manager.allocate_slots(big, 8, num_hit, hits, full_sequence_must_fit=True) is None
    )  # needs 4 blocks, 3 exist
    assert _snapshot(manager) == before


def test_full_sequence_gate_counts_whole_sequence_not_chunk(factories: Any) -> None:
    manager = _manager(num_blocks=4)
    request = _request(factories, "a", list(range(13)))  # needs 4 blocks in total
    assert manager.allocate_slots(request, 4, full_sequence_must_fit=True) is None
    assert manager.allocate_slots(request, 4) is not None  # the chunk alone fits


def test_watermark_applies_to_waiting_requests_while_something_runs(factories: Any) -> None:
    manager = _manager(num_blocks=10, watermark=0.5)  # 5 blocks of watermark, 9 usable
    request = _request(factories, "a", list(range(20)))  # 5 blocks
    assert manager.allocate_slots(request, 20, has_scheduled_reqs=True) is None
    assert manager.allocate_slots(request, 20, has_scheduled_reqs=False) is not None
    request.status = RequestStatus.RUNNING
    request.num_computed_tokens = 20
    request.append_output_token_ids(1)
    assert manager.allocate_slots(request, 1, has_scheduled_reqs=True) is not None


def test_lookahead_and_max_model_len_cap_slots(factories: Any) -> None:
    manager = KVCacheManager(100, 4, max_model_len=10)
    request = _request(factories, "a", list(range(8)))
    new = manager.allocate_slots(request, 8, num_lookahead_tokens=5)
    assert new is not None and len(new) == 3  # min(8 + 5, 10) = 10 slots


def test_hit_blocks_are_adopted_and_free_ones_counted(factories: Any) -> None:
    manager = _manager(num_blocks=5)  # 4 usable
    first = _request(factories, "a", list(range(8)))
    manager.allocate_slots(first, 8)
    manager.free(first)  # blocks 2, 1 (hashed) at the tail: free [3, 4, 2, 1]
    assert manager.block_pool.free_block_ids() == [3, 4, 2, 1]
    second = _request(factories, "b", list(range(8)) + [77] * 5)
    hits, num_hit = manager.get_computed_blocks(second)
    assert [b.block_id for b in hits] == [1, 2] and num_hit == 8
    second.num_computed_tokens = 0
    new = manager.allocate_slots(second, 5, num_hit, hits, full_sequence_must_fit=True)
    assert new is not None and [b.block_id for b in new] == [3, 4]
    assert manager.get_block_ids("b") == [1, 2, 3, 4]
    assert manager.block_pool.get_num_free_blocks() == 0


def test_free_releases_in_reverse_and_keeps_cached_blocks_for_later(factories: Any) -> None:
    manager = _manager(num_blocks=6)
    request = _request(factories, "a", list(range(10)))  # blocks 1, 2 full, 3 partial
    manager.allocate_slots(request, 10)
    assert manager.num_cached_block["a"] == 2
    manager.free(request)
    assert manager.block_pool.free_block_ids() == [3, 4, 5, 2, 1]
    assert manager.get_block_ids("a") == [] and "a" not in manager.num_cached_block


def test_prompt_logprobs_requests_skip_lookup_and_stats(factories: Any) -> None:
    manager = _manager()
    warm = _request(factories, "a", list(range(9)))
    manager.allocate_slots(warm, 9)
    request = factories.make_request("b", list(range(9)), 4, prompt_logprobs=1)
    request.set_block_hasher(get_request_block_hasher(4))
    assert manager.get_computed_blocks(request) == ([], 0)
    manager.record_prefix_cache_stats(request, 0)
    assert manager.prefix_cache_stats.requests == 0


def test_caching_disabled_never_hits(factories: Any) -> None:
    manager = _manager(enable_caching=False)
    request = _request(factories, "a", list(range(9)))
    manager.allocate_slots(request, 9)
    manager.free(request)
    assert manager.block_pool.cached_block_hash_to_block == {}
    assert manager.get_computed_blocks(_request(factories, "b", list(range(9))))[1] == 0
