"""EngineConfig validation and the scheduler-limit resolution (engine/config.py)."""

from __future__ import annotations

import pytest

from engine.config import ConfigError, EngineConfig

pytestmark = pytest.mark.timeout(30)


def test_defaults() -> None:
    cfg = EngineConfig()
    assert (cfg.block_size, cfg.max_num_seqs, cfg.scheduling_policy) == (16, 256, "fcfs")
    assert cfg.enable_chunked_prefill and cfg.enable_prefix_caching
    assert cfg.scheduler_reserve_full_isl and cfg.watermark == 0.0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("block_size", 0),
        ("block_size", True),
        ("dtype", "fp8"),
        ("max_model_len", 0),
        ("max_model_len", -2),
        ("max_model_len", "2k"),
        ("max_num_seqs", 0),
        ("max_num_batched_tokens", -1),
        ("num_gpu_blocks_override", -1),
        ("scheduling_policy", "lifo"),
        ("long_prefill_token_threshold", -1),
        ("watermark", 1.0),
        ("enable_prefix_caching", "yes"),
        ("seed", 1.5),
    ],
)
def test_invalid_values_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        EngineConfig(**{field: value})  # type: ignore[arg-type]
    message = str(info.value)
    assert message.startswith(f"{field}:") and "\n" not in message
    assert info.value.field == field


def test_max_model_len_forms() -> None:
    assert EngineConfig(max_model_len="auto").auto_fit_max_model_len
    assert EngineConfig(max_model_len=-1).auto_fit_max_model_len
    assert EngineConfig(max_model_len=None).explicit_max_model_len is None
    assert EngineConfig(max_model_len=64).explicit_max_model_len == 64


def test_scheduler_limits_default_resolution() -> None:
    assert EngineConfig().scheduler_limits(2048).max_num_batched_tokens == 8192
    assert EngineConfig(max_num_seqs=2).scheduler_limits(64).max_num_batched_tokens == 128
    no_chunk = EngineConfig(enable_chunked_prefill=False, max_num_seqs=4)
    assert no_chunk.scheduler_limits(10000).max_num_batched_tokens == 10000
    explicit = EngineConfig(max_num_batched_tokens=32, max_num_seqs=2).scheduler_limits(64)
    assert (explicit.max_num_batched_tokens, explicit.max_num_seqs) == (32, 2)


def test_scheduler_limits_checks_like_verify_max_model_len() -> None:
    with pytest.raises(ConfigError, match="smaller than max_model_len"):
        EngineConfig(enable_chunked_prefill=False, max_num_batched_tokens=32).scheduler_limits(64)
    with pytest.raises(ConfigError, match="greater than or equal to max_num_seqs"):
        EngineConfig(max_num_batched_tokens=8).scheduler_limits(64)
    with pytest.raises(ConfigError, match="long_prefill_token_threshold"):
        EngineConfig(long_prefill_token_threshold=100).scheduler_limits(64)
