"""Our KV planning (engine/core/kv_sizing.py) against the pinned vLLM's, over a grid.

``oracle.kv_planning.upstream_plan`` runs upstream's ``get_kv_cache_configs`` and capacity log
in-process; for every model shape, dtype, block size, override, max_model_len and memory size
below, our plan must give the same pool size, the same final max_model_len, the same log lines
or the same error text.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from engine.core.kv_sizing import GiB_BYTES, KVCacheCapacityError, plan_kv_cache
from engine.model_config import ModelConfigError, load_model_config

pytestmark = [pytest.mark.oracle, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
BUILT_SCRIPTED = ROOT / ".cache" / "models" / "scripted"
SHAPES: dict[str, dict[str, Any]] = {
    # The scripted model's shape (docs/scripted-model.md).
    "scripted": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 512,
        "hidden_size": 1024,
        "intermediate_size": 2048,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "torch_dtype": "float32",
    },
    # Another shape: head_dim from hidden/heads, linear rope scaling doubling 2048 to 4096.
    "scaled": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 256,
        "hidden_size": 512,
        "intermediate_size": 1024,
        "num_hidden_layers": 3,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "max_position_embeddings": 2048,
        "rope_scaling": {"type": "linear", "factor": 2.0},
        "rope_theta": 10000.0,
        "torch_dtype": "bfloat16",
    },
}
OVERRIDES = (None, 1, 2, 3, 4, 5, 9)
MAX_MODEL_LENS = (None, -1, 1, 16, 17, 48, 64, 100, 2048, 4096, 8192, 9000)


@pytest.fixture(scope="module")
def upstream() -> Any:
    import oracle.kv_planning

    return oracle.kv_planning


def _model_dir(name: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if name == "built-scripted":
        return BUILT_SCRIPTED
    folder = tmp_path_factory.mktemp(name)
    (folder / "config.json").write_text(json.dumps(SHAPES[name]))
    return folder


def _ours(model_dir: Path, **kwargs: Any) -> tuple[int | None, int | None, str | None, tuple]:
    try:
        result = plan_kv_cache(load_model_config(model_dir), **kwargs)
    except (KVCacheCapacityError, ModelConfigError) as exc:
        return None, None, str(exc), ()
    return result.num_blocks, result.max_model_len, None, result.log_lines


MODELS = ["scripted", "scaled"] + (["built-scripted"] if BUILT_SCRIPTED.is_dir() else [])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("block_size", [16, 32, 64])
@pytest.mark.parametrize("model_name", MODELS)
def test_plan_matches_upstream(
    upstream: Any,
    tmp_path_factory: pytest.TempPathFactory,
    model_name: str,
    block_size: int,
    dtype: str,
) -> None:
    model_dir = _model_dir(model_name, tmp_path_factory)
    per_block = plan_kv_cache(
        load_model_config(model_dir), block_size=block_size, dtype=dtype, available_memory=GiB_BYTES
    ).bytes_per_block
    memories = (GiB_BYTES, 7 * per_block + per_block // 2, per_block)
    mismatches = []
    checked = 0
    for override, max_len, memory in itertools.product(OVERRIDES, MAX_MODEL_LENS, memories):
        if override is not None and memory != GiB_BYTES:
            continue  # the override replaces the memory: one memory size is enough
        kwargs = {
            "block_size": block_size,
            "available_memory": memory,
            "num_gpu_blocks_override": override,
            "max_model_len": max_len,
        }
        got = _ours(model_dir, dtype=dtype, **kwargs)
        theirs = upstream.upstream_plan(model_dir, dtype=dtype, **kwargs)
        want = (theirs.num_blocks, theirs.max_model_len, theirs.error, theirs.log_lines)
        if want[2] is not None:
            got, want = got[:3], want[:3]  # on refusal upstream has logged only the override
        checked += 1
        if got != want:
            mismatches.append(f"{kwargs}: ours {got} != upstream {want}")
    assert checked > 80
    assert not mismatches, "\n".join(mismatches[:10])
