"""Block hashing and the free-block queue (engine/core/kv_cache_utils.py)."""

from __future__ import annotations

import hashlib
import pickle
from typing import Any

import pytest

from engine.core import kv_cache_utils as kcu
from engine.core.kv_cache_utils import (
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    get_request_block_hasher,
    hash_block_tokens,
    make_block_hash_with_group_id,
)

pytestmark = pytest.mark.timeout(30)


def _sha(obj: object) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def test_none_hash_seed_default_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    kcu.init_none_hash()
    assert kcu.NONE_HASH == _sha("vllm-none-hash")
    monkeypatch.setenv("PYTHONHASHSEED", "1234")
    kcu.init_none_hash()
    assert kcu.NONE_HASH == _sha("1234")
    monkeypatch.delenv("PYTHONHASHSEED")
    kcu.init_none_hash()


def test_hash_block_tokens_chains_on_parent() -> None:
    first = hash_block_tokens(None, [1, 2, 3])
    assert first == _sha((kcu.NONE_HASH, (1, 2, 3), None))
    second = hash_block_tokens(first, [4, 5, 6], (("cache_salt", "s"),))
    assert second == _sha((first, (4, 5, 6), (("cache_salt", "s"),)))


def test_group_id_suffix_is_four_big_endian_bytes() -> None:
    assert make_block_hash_with_group_id(b"\xab" * 32, 0) == b"\xab" * 32 + b"\x00\x00\x00\x00"
    assert make_block_hash_with_group_id(b"h", 258)[-4:] == b"\x00\x00\x01\x02"


def test_request_block_hasher_hashes_full_blocks_only(factories: Any) -> None:
    request = factories.make_request("a", list(range(10)), 8)
    hasher = get_request_block_hasher(4)
    request.set_block_hasher(hasher)
    assert len(request.block_hashes) == 2  # 10 tokens: 2 full blocks of 4
    assert request.block_hashes[0] == hash_block_tokens(None, [0, 1, 2, 3])
    assert request.block_hashes[1] == hash_block_tokens(request.block_hashes[0], [4, 5, 6, 7])
    request.append_output_token_ids(50)
    assert len(request.block_hashes) == 2
    request.append_output_token_ids(51)
    assert request.block_hashes[2] == hash_block_tokens(request.block_hashes[1], [8, 9, 50, 51])


def test_cache_salt_only_keys_the_first_block(factories: Any) -> None:
    request = factories.make_request("a", list(range(8)), 8)
    request.cache_salt = "salt"
    request.set_block_hasher(get_request_block_hasher(4))
    salted = hash_block_tokens(None, [0, 1, 2, 3], (("cache_salt", "salt"),))
    assert request.block_hashes == [salted, hash_block_tokens(salted, [4, 5, 6, 7])]


def _ids(queue: FreeKVCacheBlockQueue) -> list[int]:
    return [b.block_id for b in queue.get_all_free_blocks()]


def test_free_queue_operations_keep_order_and_count() -> None:
    blocks = [KVCacheBlock(i) for i in range(6)]
    queue = FreeKVCacheBlockQueue(blocks)
    assert _ids(queue) == [0, 1, 2, 3, 4, 5] and queue.num_free_blocks == 6
    assert queue.popleft().block_id == 0
    assert [b.block_id for b in queue.popleft_n(2)] == [1, 2]
    queue.remove(blocks[4])
    assert _ids(queue) == [3, 5] and queue.num_free_blocks == 2
    queue.prepend_n([blocks[2], blocks[1]])
    queue.append_n([blocks[0], blocks[4]])
    assert _ids(queue) == [2, 1, 3, 5, 0, 4] and queue.num_free_blocks == 6
    with pytest.raises(RuntimeError):
        queue.remove(KVCacheBlock(99))
    assert len(queue.popleft_n(6)) == 6 and queue.num_free_blocks == 0
    with pytest.raises(ValueError):
        queue.popleft()
    queue.append(blocks[3])
    assert _ids(queue) == [3]
