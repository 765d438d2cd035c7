"""The model builder: deterministic folders, a valid safetensors file, the documented shape."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest

from contract.scripted import weights
from contract.scripted.builder import BuildError, build, model_config, safetensors_bytes
from parity.cli import main as parity_main

pytestmark = pytest.mark.timeout(120)

FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
}


def _on_disk(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def test_scripted_build_is_deterministic_and_fast(tmp_path: Path) -> None:
    started = time.perf_counter()
    first = build("scripted", tmp_path / "a")
    elapsed = time.perf_counter() - started
    second = build("scripted", tmp_path / "b")
    assert set(first) == FILES
    assert first == second
    assert _on_disk(tmp_path / "a") == first == _on_disk(tmp_path / "b")
    assert elapsed < 3.0  # a fraction of a second when the machine is idle


def test_rebuild_in_place_leaves_no_partial_files(tmp_path: Path) -> None:
    first = build("scripted", tmp_path)
    assert build("scripted", tmp_path) == first
    assert {p.name for p in tmp_path.iterdir()} == FILES


def test_random_build_is_deterministic_per_seed(tmp_path: Path) -> None:
    a = build("random", tmp_path / "a", seed=0)
    b = build("random", tmp_path / "b", seed=0)
    c = build("random", tmp_path / "c", seed=1)
    scripted = build("scripted", tmp_path / "s")
    assert a == b
    assert c["model.safetensors"] != a["model.safetensors"]
    assert scripted["model.safetensors"] != a["model.safetensors"]
    # Same architecture and tokenizer: only the weights differ.
    assert {k: v for k, v in a.items() if k != "model.safetensors"} == {
        k: v for k, v in scripted.items() if k != "model.safetensors"
    }


def test_cli_prints_the_hashes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert parity_main(["model", "build", "--variant", "scripted", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sorted(lines) == sorted(f"{d}  {n}" for n, d in _on_disk(tmp_path).items())


def test_unknown_variant_is_a_build_error(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="unknown model variant 'huge'"):
        build("huge", tmp_path)


def test_config_has_the_documented_shape(scripted_model_dir: Path) -> None:
    config = json.loads((scripted_model_dir / "config.json").read_text())
    assert config == model_config()
    assert config["architectures"] == ["LlamaForCausalLM"]
    expected = {
        "vocab_size": 512,
        "hidden_size": 1024,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "intermediate_size": 1024,
        "rope_theta": 1e6,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    assert {k: config[k] for k in expected} == expected


@pytest.mark.parametrize("variant_fixture", ["scripted_model_dir", "random_model_dir"])
def test_safetensors_loads_with_the_llama_tensor_names(
    variant_fixture: str, request: pytest.FixtureRequest
) -> None:
    from safetensors import safe_open

    folder: Path = request.getfixturevalue(variant_fixture)
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        shapes = {name: tuple(f.get_slice(name).get_shape()) for name in names}
        dtypes = {f.get_slice(name).get_dtype() for name in names}
    assert shapes == dict(weights.tensor_shapes())
    assert dtypes == {"BF16"}


def test_scripted_values_are_exact_bf16_and_mostly_zero(scripted_model_dir: Path) -> None:
    import torch
    from safetensors.torch import load_file

    tensors = load_file(str(scripted_model_dir / "model.safetensors"))
    embed = tensors["model.embed_tokens.weight"].float()
    assert torch.equal(embed[:, :512], 32 * torch.eye(512))
    assert torch.equal(embed[:, 1023], torch.ones(512))
    for name, tensor in tensors.items():
        if "mlp" in name:
            assert not tensor.any(), name
        if name.endswith("norm.weight"):
            assert torch.equal(tensor.float(), torch.ones(1024)), name
    nonzero = sum(int(t.count_nonzero()) for t in tensors.values())
    assert nonzero < 0.01 * sum(t.numel() for t in tensors.values())


def test_bf16_bits_refuses_inexact_values() -> None:
    assert weights.bf16_bits(1.5) == 0x3FC0
    with pytest.raises(ValueError, match="not exactly representable"):
        weights.bf16_bits(0.1)


def test_safetensors_header_is_aligned_and_checked() -> None:
    data = safetensors_bytes({"x": ((2,), b"\x00\x01\x02\x03")})
    header_len = int.from_bytes(data[:8], "little")
    assert header_len % 8 == 0
    header = json.loads(data[8 : 8 + header_len])
    assert header["x"] == {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}
    with pytest.raises(ValueError, match="bytes for bf16 shape"):
        safetensors_bytes({"x": ((3,), b"\x00\x01")})
