"""KV sizing and startup validation: S1-S4 (docs/upstream-behaviour.md) and tiny KV caches
(docs/oracle-on-cpu.md).

The model has the scripted model's shape (2 layers, 2 KV heads, head_dim 128), so one block of
16 tokens is 2 * 2 * 16 * (128 + 128) * 4 = 65,536 bytes in float32 and half that in bfloat16.
Expected outcomes are upstream's (checked against the pinned vLLM in
tests/oracle/test_kv_planning.py); here they are fixed numbers from the spec.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.core.kv_sizing import (
    GiB_BYTES,
    KVCacheCapacityError,
    KVCacheSpaceError,
    SchedulerConfigError,
    check_scheduler_limits,
    cpu_available_kv_memory,
    estimate_max_model_len,
    format_gib,
    kv_bytes_per_block,
    kv_cache_space_bytes,
    plan_kv_cache,
)
from engine.model_config import MaxModelLenError, ModelConfig, load_model_config

pytestmark = pytest.mark.timeout(30)

SCRIPTED_SHAPE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 512,
    "hidden_size": 1024,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "max_position_embeddings": 8192,
    "torch_dtype": "float32",
}


@pytest.fixture
def model(tmp_path: Path) -> ModelConfig:
    (tmp_path / "config.json").write_text(json.dumps(SCRIPTED_SHAPE))
    return load_model_config(tmp_path)


def plan(model: ModelConfig, blocks: int | None, max_model_len: int | str | None, **kw):  # type: ignore[no-untyped-def]
    kw.setdefault("block_size", 16)
    kw.setdefault("dtype", "float32")
    kw.setdefault("available_memory", GiB_BYTES)
    return plan_kv_cache(model, num_gpu_blocks_override=blocks, max_model_len=max_model_len, **kw)


def test_bytes_per_block_for_the_scripted_shape() -> None:
    shape = {"num_layers": 2, "num_kv_heads": 2, "head_size": 128}
    assert kv_bytes_per_block(**shape, dtype="float32", block_size=16) == 65_536
    assert kv_bytes_per_block(**shape, dtype="bfloat16", block_size=16) == 32_768
    assert kv_bytes_per_block(**shape, dtype="float32", block_size=32) == 131_072


def test_s1_four_blocks_refuse_64_with_estimate_48(model: ModelConfig) -> None:
    with pytest.raises(KVCacheCapacityError) as err:
        plan(model, 4, 64)
    msg = str(err.value)
    assert msg.startswith(
        "To serve at least one request with the model's max seq len (64), "
        "(0.0 GiB KV cache is needed, which is larger than the available KV cache memory "
        "(0.0 GiB). Based on the available memory, the estimated maximum model length is 48. "
        "Try increasing `gpu_memory_utilization`"
    )
    assert "\n" not in msg


def test_s1_default_length_refuses_with_the_same_estimate(model: ModelConfig) -> None:
    with pytest.raises(KVCacheCapacityError, match=r"max seq len \(8192\).* is 48\. "):
        plan(model, 4, None)
    with pytest.raises(KVCacheCapacityError, match=r"max seq len \(2048\).* is 48\. "):
        plan(model, 4, 2048)


def test_s2_five_blocks_accept_64_and_log_capacity_with_the_null_block(model: ModelConfig) -> None:
    result = plan(model, 5, 64)
    assert (result.num_blocks, result.num_usable_blocks, result.max_model_len) == (5, 4, 64)
    assert result.log_lines == (
        "Overriding num_gpu_blocks=16384 with num_gpu_blocks_override=5",
        "CPU KV cache size: 80 tokens, Maximum concurrency for 64 tokens per request: 1.25x",
    )
    assert (result.kv_cache_size_tokens, result.max_concurrency) == (80, 1.25)


def test_s3_auto_fits_four_blocks_to_48(model: ModelConfig) -> None:
    for value in ("auto", "-1", -1):
        result = plan(model, 4, value)
        assert (result.num_blocks, result.max_model_len) == (4, 48)
    assert result.log_lines[1] == (
        "Auto-fit max_model_len: reduced from 8192 to 48 to fit in available KV cache "
        "memory (0.0 GiB CPU)"
    )
    assert result.log_lines[2] == (
        "CPU KV cache size: 64 tokens, Maximum concurrency for 48 tokens per request: 1.33x"
    )


def test_s4_one_block_has_no_memory(model: ModelConfig) -> None:
    with pytest.raises(KVCacheCapacityError, match=r"^No available memory for the cache blocks\."):
        plan(model, 1, 64)
    with pytest.raises(KVCacheCapacityError, match=r"^Cannot auto-fit max_model_len: not enough"):
        plan(model, 1, "auto")


def test_s4_two_blocks_hold_16_but_not_17(model: ModelConfig) -> None:
    assert plan(model, 2, 16).max_model_len == 16
    with pytest.raises(KVCacheCapacityError) as err:
        plan(model, 2, 17)
    assert "max seq len (17)" in str(err.value)
    assert "the estimated maximum model length is 16. " in str(err.value)


@pytest.mark.parametrize(("blocks", "expected"), [(2, 32), (4, 96)])
def test_block_size_32_auto_fit(model: ModelConfig, blocks: int, expected: int) -> None:
    assert plan(model, blocks, "auto", block_size=32).max_model_len == expected


def test_full_context_fits_logs_so(model: ModelConfig) -> None:
    result = plan(model, None, "auto")
    assert result.max_model_len == 8192
    assert result.num_blocks == GiB_BYTES // 65_536
    assert result.log_lines == (
        "Auto-fit max_model_len: full model context length 8192 fits in available KV cache "
        "memory (1.0 GiB CPU)",
        "CPU KV cache size: 262,144 tokens, Maximum concurrency for 8,192 tokens per request: "
        "32.00x",
    )


def test_bfloat16_halves_the_block(model: ModelConfig) -> None:
    result = plan(model, None, 144, dtype="bfloat16", available_memory=10 * 32_768 + 5)
    assert (result.bytes_per_block, result.num_blocks) == (32_768, 10)
    with pytest.raises(KVCacheCapacityError, match=r"estimated maximum model length is 144\. "):
        plan(model, None, 160, dtype="bfloat16", available_memory=10 * 32_768 + 5)


def test_legacy_null_block_counts_every_block(model: ModelConfig) -> None:
    assert plan(model, 4, "auto", legacy_null_block=True).max_model_len == 64
    assert plan(model, 4, 64, legacy_null_block=True).num_blocks == 4
    with pytest.raises(KVCacheCapacityError, match=r"length is 64\. "):
        plan(model, 4, 65, legacy_null_block=True)


def test_explicit_length_above_the_derived_one(model: ModelConfig) -> None:
    with pytest.raises(MaxModelLenError) as err:
        plan(model, None, 9000)
    assert str(err.value).startswith(
        "User-specified max_model_len (9000) is greater than the derived max_model_len "
        "(max_position_embeddings=8192.0 or model_max_length=None in model's config.json). "
        "To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."
    )
    assert plan(model, None, 9000, allow_long_max_model_len=True).max_model_len == 9000


def test_estimate_is_a_binary_search_over_whole_blocks() -> None:
    assert estimate_max_model_len(8192, 3 * 100, 100, 16) == 48
    assert estimate_max_model_len(40, 3 * 100, 100, 16) == 40
    assert estimate_max_model_len(8192, 99, 100, 16) == 0
    assert estimate_max_model_len(8192, -100, 100, 16) == 0


def test_format_gib_rounds_to_two_places() -> None:
    assert format_gib(GiB_BYTES) == "1.0"
    assert format_gib(0) == "0.0"
    assert format_gib(GiB_BYTES * 3 // 2 + 1) == "1.5"
    assert format_gib(int(GiB_BYTES * 0.126)) == "0.13"


def test_scheduler_limits() -> None:
    ok = {"max_num_seqs": 4, "max_model_len": 64, "enable_chunked_prefill": False}
    assert check_scheduler_limits(max_num_batched_tokens=64, **ok) == []
    with pytest.raises(SchedulerConfigError) as err:
        check_scheduler_limits(max_num_batched_tokens=63, **ok)
    assert str(err.value) == (
        "max_num_batched_tokens (63) is smaller than max_model_len (64). This effectively "
        "limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject "
        "longer sequences. Please increase max_num_batched_tokens or decrease max_model_len."
    )
    chunked = {**ok, "enable_chunked_prefill": True, "max_num_seqs": 8}
    assert check_scheduler_limits(max_num_batched_tokens=8, **chunked) == []
    with pytest.raises(SchedulerConfigError) as err:
        check_scheduler_limits(max_num_batched_tokens=7, **chunked)
    assert str(err.value) == (
        "max_num_batched_tokens (7) must be greater than or equal to max_num_seqs (8)."
    )
    warnings = check_scheduler_limits(max_num_batched_tokens=8192, **chunked)
    assert warnings == [
        "max_num_batched_tokens (8192) exceeds max_num_seqs * max_model_len (512). "
        "This may lead to unexpected behavior."
    ]
    with pytest.raises(SchedulerConfigError, match=r"long_prefill_token_threshold \(65\)"):
        check_scheduler_limits(max_num_batched_tokens=64, long_prefill_token_threshold=65, **ok)


def test_kv_cache_space_env() -> None:
    assert kv_cache_space_bytes({}) is None
    assert kv_cache_space_bytes({"VLLM_CPU_KVCACHE_SPACE": ""}) is None
    assert kv_cache_space_bytes({"VLLM_CPU_KVCACHE_SPACE": "2"}) == 2 * GiB_BYTES
    with pytest.raises(KVCacheSpaceError, match="invalid literal for int"):
        kv_cache_space_bytes({"VLLM_CPU_KVCACHE_SPACE": "1.5"})


def test_cpu_available_kv_memory() -> None:
    node = {"total_memory": 24 * GiB_BYTES, "available_memory": 20 * GiB_BYTES}
    env = {"VLLM_CPU_KVCACHE_SPACE": "1"}
    size, line = cpu_available_kv_memory(env, consumed_memory=GiB_BYTES, **node)
    assert size == GiB_BYTES
    assert line == "Explicitly set (1.0/24.0) GiB for KV cache on node 0."
    with pytest.raises(KVCacheSpaceError, match=r"requested memory for kv \(21\.0 GiB\)"):
        cpu_available_kv_memory({"VLLM_CPU_KVCACHE_SPACE": "21"}, consumed_memory=0, **node)
    # Unset: 0.92 of the node minus the worker's RSS, if the node has that much free.
    with pytest.raises(KVCacheSpaceError, match=r"desired CPU memory utilization \(0\.92, 22\.08"):
        cpu_available_kv_memory({}, consumed_memory=GiB_BYTES, **node)
    size, line = cpu_available_kv_memory(
        {}, consumed_memory=GiB_BYTES, gpu_memory_utilization=0.5, **node
    )
    assert size == 11 * GiB_BYTES
    assert line.startswith("Auto set (11.0/24.0) GiB for KV cache on node 0, with 12.0 GiB")
