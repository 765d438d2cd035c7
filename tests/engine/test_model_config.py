"""engine/model_config.py and engine/hf_config.py: reading a model folder without
transformers, as upstream reads it.

The unit tests pin behaviour on small hand-written folders; the oracle tests build upstream's
own ``ModelConfig`` on the same folders and compare every fact we derive.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from engine.hf_config import load_generation_config
from engine.model_config import (
    MaxModelLenError,
    ModelConfig,
    ModelConfigError,
    default_sampling_params,
    load_model_config,
    override_max_tokens,
    parse_max_model_len,
    resolve_dtype,
    resolve_max_model_len,
)

pytestmark = pytest.mark.timeout(60)

LLAMA: dict[str, Any] = {
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
    "bos_token_id": 389,
    "eos_token_id": 390,
    "torch_dtype": "float32",
}


def write_model(
    folder: Path,
    changes: dict[str, Any] | None = None,
    drop: tuple[str, ...] = (),
    generation: dict[str, Any] | None = None,
    weights_dtype: str | None = None,
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in {**LLAMA, **(changes or {})}.items() if k not in drop}
    (folder / "config.json").write_text(json.dumps(config))
    if generation is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation))
    if weights_dtype is not None:
        header = json.dumps({"w": {"dtype": weights_dtype, "shape": [2], "data_offsets": [0, 4]}})
        blob = header.encode()
        (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(4))
    return folder


def test_reads_the_scripted_shape(tmp_path: Path) -> None:
    model = load_model_config(write_model(tmp_path))
    assert model.architectures == ("LlamaForCausalLM",)
    assert (model.num_hidden_layers, model.num_attention_heads, model.num_key_value_heads) == (
        2,
        8,
        2,
    )
    assert (model.head_dim, model.vocab_size, model.hidden_size) == (128, 512, 1024)
    assert (model.bos_token_id, model.eos_token_id, model.config_dtype) == (389, 390, "float32")
    assert model.max_model_len == 8192
    assert model.derived_max_model_len == 8192.0 and model.max_len_key == "max_position_embeddings"
    assert model.generation_config == {"bos_token_id": 389, "eos_token_id": 390}


@pytest.mark.parametrize("head_dim", [None, 0, "drop"])
def test_head_dim_falls_back_to_hidden_over_heads(tmp_path: Path, head_dim: Any) -> None:
    drop = ("head_dim",) if head_dim == "drop" else ()
    changes = {} if drop else {"head_dim": head_dim}
    assert load_model_config(write_model(tmp_path, changes, drop)).head_dim == 1024 // 8


def test_kv_heads_default_to_attention_heads(tmp_path: Path) -> None:
    model = load_model_config(write_model(tmp_path, drop=("num_key_value_heads",)))
    assert model.num_key_value_heads == 8


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, 16384),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 1.5}}, 12288),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, 8192),  # pre-scaled
        ({"rope_scaling": {"type": "linear", "factor": None}}, 8192),  # null factor -> 1.0
        ({"model_max_length": 4096}, 4096),  # model_max_length wins outright
        ({"max_position_embeddings": 1000, "seq_length": 900}, 900),  # smallest key
    ],
)
def test_derived_max_model_len(tmp_path: Path, changes: dict[str, Any], expected: int) -> None:
    assert load_model_config(write_model(tmp_path, changes)).max_model_len == expected


def test_no_length_key_assumes_2048(tmp_path: Path) -> None:
    model = load_model_config(write_model(tmp_path, drop=("max_position_embeddings",)))
    assert (model.max_model_len, model.max_len_key) == (2048, None)


def test_explicit_max_model_len_is_checked(tmp_path: Path) -> None:
    model = load_model_config(write_model(tmp_path))
    assert resolve_max_model_len(model, 8192) == 8192
    assert resolve_max_model_len(model, -1) == 8192
    with pytest.raises(MaxModelLenError, match=r"^User-specified max_model_len \(8193\)"):
        resolve_max_model_len(model, 8193)
    assert resolve_max_model_len(model, 8193, allow_long=True) == 8193
    limited = load_model_config(write_model(tmp_path / "m", {"model_max_length": 9000}))
    assert resolve_max_model_len(limited, 9000) == 9000  # model_max_length is the derived one


def test_checkpoint_dtype(tmp_path: Path) -> None:
    both = {"dtype": "bfloat16", "torch_dtype": "float32"}
    assert load_model_config(write_model(tmp_path / "a", both)).config_dtype == "bfloat16"
    weights = write_model(tmp_path / "b", drop=("torch_dtype",), weights_dtype="BF16")
    assert load_model_config(weights).config_dtype == "bfloat16"
    bare = write_model(tmp_path / "c", drop=("torch_dtype",))
    assert load_model_config(bare).config_dtype == "float32"


@pytest.mark.parametrize(
    ("config_dtype", "flag", "expected"),
    [
        ("float32", "auto", "bfloat16"),  # the CPU platform prefers bfloat16
        ("bfloat16", "auto", "bfloat16"),
        ("float16", "auto", "float16"),
        ("float32", "float32", "float32"),
        ("bfloat16", "float", "float32"),
        ("float32", "half", "float16"),
        ("float32", "BFloat16", "bfloat16"),
    ],
)
def test_resolve_dtype(tmp_path: Path, config_dtype: str, flag: str, expected: str) -> None:
    model = load_model_config(write_model(tmp_path, {"torch_dtype": config_dtype}))
    assert resolve_dtype(model, flag) == expected


def test_unknown_dtype(tmp_path: Path) -> None:
    model = load_model_config(write_model(tmp_path))
    with pytest.raises(ModelConfigError) as err:
        resolve_dtype(model, "int8")
    assert str(err.value) == "Unknown dtype: 'int8'"


@pytest.mark.parametrize(
    ("text", "value"),
    [("auto", -1), ("AUTO", -1), ("-1", -1), ("2048", 2048), ("1k", 1000), ("1K", 1024)]
    + [("25.6k", 25600), (" 64 ", 64)],
)
def test_parse_max_model_len(text: str, value: int) -> None:
    assert parse_max_model_len(text) == value


@pytest.mark.parametrize("text", ["", "x", "1.5K", "k"])
def test_parse_max_model_len_rejects(text: str) -> None:
    with pytest.raises(ModelConfigError, match="invalid max_model_len"):
        parse_max_model_len(text)


def test_user_errors_name_the_file(tmp_path: Path) -> None:
    cases: list[tuple[Path, str]] = [(tmp_path / "missing", "folder does not exist")]
    (tmp_path / "empty").mkdir()
    cases.append((tmp_path / "empty", "file not found"))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    cases.append((tmp_path / "bad", "cannot read JSON"))
    (tmp_path / "list").mkdir()
    (tmp_path / "list" / "config.json").write_text("[]")
    cases.append((tmp_path / "list", "expected a JSON object, got list"))
    cases.append((write_model(tmp_path / "l", {"num_hidden_layers": "2"}), "num_hidden_layers"))
    cases.append((write_model(tmp_path / "k", {"num_key_value_heads": 3}), "num_key_value_heads"))
    for folder, fragment in cases:
        with pytest.raises(ModelConfigError) as err:
            load_model_config(folder)
        line = str(err.value)
        assert line.startswith(str(folder / "config.json") + ": ") and fragment in line
        assert "\n" not in line


def test_generation_config_defaults(tmp_path: Path) -> None:
    generation = {"eos_token_id": [390, 391], "temperature": 0.6, "max_new_tokens": 32}
    generation |= {"top_k": None, "do_sample": True}
    folder = write_model(tmp_path, generation=generation)
    model = load_model_config(folder)
    assert model.generation_config == {"eos_token_id": [390, 391], "temperature": 0.6} | {
        "max_new_tokens": 32
    }
    assert default_sampling_params(model.generation_config) == {
        "temperature": 0.6,
        "max_tokens": 32,
    }
    override = default_sampling_params(model.generation_config, {"max_new_tokens": 8})
    assert override == {"temperature": 0.6, "max_tokens": 8}
    assert load_generation_config(folder, "vllm") == {}
    assert default_sampling_params({"eos_token_id": 1}) == {}


def test_generation_config_from_another_folder_or_bad_json(tmp_path: Path) -> None:
    other = write_model(tmp_path / "other", {"eos_token_id": [7, 8]})
    assert load_generation_config(tmp_path / "m", str(other))["eos_token_id"] == [7, 8]
    folder = write_model(tmp_path / "bad")
    (folder / "generation_config.json").write_text("{oops")
    assert load_model_config(folder).generation_config == {"bos_token_id": 389, "eos_token_id": 390}


def test_config_json_cannot_set_transformers_sampling_defaults(tmp_path: Path) -> None:
    changes = {"temperature": 0.5, "top_k": 5, "top_p": 0.9, "repetition_penalty": 1.1}
    folder = write_model(tmp_path, changes | {"min_p": 0.1, "max_new_tokens": 7})
    defaults = default_sampling_params(load_model_config(folder).generation_config)
    assert defaults == {"min_p": 0.1, "max_tokens": 7}


def test_override_max_tokens() -> None:
    assert override_max_tokens("auto", {"max_tokens": 32}) is None
    assert override_max_tokens("vllm", {}, {"max_new_tokens": 8}) == 8
    assert override_max_tokens("/models/gen", {"max_tokens": 32}) == 32


# ---- against the pinned vLLM ------------------------------------------------------------------

ORACLE_FOLDERS: dict[str, dict[str, Any]] = {
    "scripted": {},
    "no-head-dim": {"changes": {"head_dim": None}, "drop": ("num_key_value_heads",)},
    "linear-rope": {"changes": {"rope_scaling": {"type": "linear", "factor": 2.0}}},
    "llama3-rope": {
        "changes": {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 1024,
            }
        }
    },
    "model-max-length": {"changes": {"model_max_length": 4096}},
    "bf16": {"changes": {"torch_dtype": "bfloat16"}},
    "fp16": {"changes": {"torch_dtype": "float16"}},
    "bf16-weights": {"drop": ("torch_dtype",), "weights_dtype": "BF16"},
    "generation": {
        "generation": {"eos_token_id": [390, 391], "temperature": 0.6, "max_new_tokens": 32}
    },
    "eos-list-no-generation": {
        "changes": {"eos_token_id": [390, 392], "top_p": 0.9, "min_p": 0.1, "max_new_tokens": 7}
    },
}


@pytest.fixture(scope="module")
def upstream() -> Any:
    import oracle.kv_planning

    return oracle.kv_planning


def _facts(model: ModelConfig) -> dict[str, Any]:
    return {
        "architectures": model.architectures,
        "num_hidden_layers": model.num_hidden_layers,
        "num_attention_heads": model.num_attention_heads,
        "num_key_value_heads": model.num_key_value_heads,
        "head_dim": model.head_dim,
        "vocab_size": model.vocab_size,
        "max_model_len": model.max_model_len,
        "max_len_key": model.max_len_key,
        "dtype": resolve_dtype(model, "auto"),
        "generation_eos": model.generation_config.get("eos_token_id"),
        "default_sampling_params": default_sampling_params(model.generation_config),
    }


@pytest.mark.oracle
@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", sorted(ORACLE_FOLDERS))
def test_model_facts_match_upstream(upstream: Any, tmp_path: Path, name: str) -> None:
    folder = write_model(tmp_path / name, **ORACLE_FOLDERS[name])
    assert _facts(load_model_config(folder)) == upstream.upstream_model_facts(folder)


@pytest.mark.oracle
@pytest.mark.timeout(240)
def test_max_model_len_and_dtype_match_upstream(upstream: Any, tmp_path: Path) -> None:
    for name in ("scripted", "linear-rope", "model-max-length"):
        folder = write_model(tmp_path / name, **ORACLE_FOLDERS[name])
        model = load_model_config(folder)
        for requested in (None, -1, 1, 4096, 8192, 8193, 16384, 16385):
            want = upstream.upstream_max_model_len(folder, requested)
            try:
                got: tuple[int | None, str | None] = (
                    resolve_max_model_len(model, requested),
                    None,
                )
            except MaxModelLenError as exc:
                got = (None, str(exc))
            assert got == want, (name, requested)
    for config_dtype in ("float32", "bfloat16", "float16"):
        folder = write_model(tmp_path / config_dtype, {"torch_dtype": config_dtype})
        model = load_model_config(folder)
        for flag in ("auto", "half", "float16", "float", "float32", "bfloat16"):
            assert resolve_dtype(model, flag) == upstream.upstream_dtype(folder, flag)
