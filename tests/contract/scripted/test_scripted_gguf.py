"""The GGUF export: header, metadata, tensor layout, the q/k permutation, determinism, the CLI.

Every check reads the file back with the test's own reader (``gguf_support``) and compares it
with the HF folder the builder writes (``config.json``, the tokenizer files, the bf16
``model.safetensors``), not with the exporter's own tables.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import pytest
from gguf_support import GgufFile, read_gguf

from contract.scripted import gguf, vocab, weights
from parity.cli import main as parity_main

pytestmark = pytest.mark.timeout(120)

F32, BF16 = 0, 30
NORMAL, CONTROL, USER_DEFINED = 1, 3, 4
HEAD_DIM = weights.HEAD_DIM


@pytest.fixture(scope="module")
def exported() -> dict[str, GgufFile]:
    return {dtype: read_gguf(gguf.gguf_bytes("scripted", dtype)) for dtype in gguf.DTYPES}


@pytest.fixture(scope="module")
def hf_folder(scripted_model_dir: Path) -> dict[str, dict]:
    names = ("config.json", "tokenizer.json", "tokenizer_config.json")
    return {name: json.loads((scripted_model_dir / name).read_text()) for name in names}


@pytest.fixture(scope="module")
def hf_tensors(scripted_model_dir: Path) -> dict[str, tuple[list[int], bytes]]:
    """name -> (shape, bf16 bytes), parsed from model.safetensors with the standard library."""
    raw = (scripted_model_dir / "model.safetensors").read_bytes()
    (length,) = struct.unpack_from("<Q", raw)
    header = json.loads(raw[8 : 8 + length])
    base = 8 + length
    out = {}
    for name, entry in header.items():
        if name != "__metadata__":
            start, end = entry["data_offsets"]
            out[name] = (entry["shape"], raw[base + start : base + end])
    return out


def _f32_rows(data: bytes, width: int) -> list[tuple[float, ...]]:
    values = struct.unpack(f"<{len(data) // 4}f", data)
    return [values[i : i + width] for i in range(0, len(values), width)]


def _bf16_rows(data: bytes, width: int) -> list[tuple[float, ...]]:
    bits = struct.unpack(f"<{len(data) // 2}H", data)
    values = struct.unpack(
        f"<{len(bits)}f", struct.pack(f"<{len(bits)}I", *(b << 16 for b in bits))
    )
    return [values[i : i + width] for i in range(0, len(values), width)]


def test_header_and_alignment(exported: dict[str, GgufFile]) -> None:
    for dtype, file in exported.items():
        assert file.version == 3
        assert len(file.tensors) == 3 + 9 * weights.NUM_LAYERS
        assert file.data_start % 32 == 0
        sizes = []
        for info in file.tensors.values():
            assert info.offset % 32 == 0, info
            sizes.append(info.offset + len(file.tensor_bytes(info.name)))
        assert len(file.raw) == file.data_start + max(sizes) + (-max(sizes) % 32), dtype
        assert file.kv["general.file_type"] == {"f32": 0, "bf16": 32}[dtype]


def test_hyperparameters_match_config(
    exported: dict[str, GgufFile], hf_folder: dict[str, dict]
) -> None:
    config = hf_folder["config.json"]
    kv = exported["f32"].kv
    assert kv["general.architecture"] == "llama"
    expected = {
        "llama.block_count": config["num_hidden_layers"],
        "llama.context_length": config["max_position_embeddings"],
        "llama.embedding_length": config["hidden_size"],
        "llama.feed_forward_length": config["intermediate_size"],
        "llama.attention.head_count": config["num_attention_heads"],
        "llama.attention.head_count_kv": config["num_key_value_heads"],
        "llama.attention.key_length": config["head_dim"],
        "llama.attention.value_length": config["head_dim"],
        "llama.rope.dimension_count": config["head_dim"],
        "llama.vocab_size": config["vocab_size"],
    }
    assert {key: kv[key] for key in expected} == expected
    assert kv["llama.rope.freq_base"] == config["rope_theta"]
    assert kv["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(config["rms_norm_eps"])
    assert exported["f32"].kv_types["llama.rope.freq_base"] == 6  # FLOAT32


def test_tokenizer_metadata_matches_hf_files(
    exported: dict[str, GgufFile], hf_folder: dict[str, dict]
) -> None:
    kv = exported["f32"].kv
    tok, tok_config = hf_folder["tokenizer.json"], hf_folder["tokenizer_config.json"]
    assert kv["tokenizer.ggml.model"] == "gpt2"
    # gpt-2 is llama.cpp's pre-type for GPT-2's regex, which a regex ByteLevel pre-tokenizer uses
    assert tok["pre_tokenizer"] == {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": True,
        "use_regex": True,
    }
    assert kv["tokenizer.ggml.pre"] == "gpt-2"
    by_id = {token_id: text for text, token_id in tok["model"]["vocab"].items()}
    by_id.update({added["id"]: added["content"] for added in tok["added_tokens"]})
    assert kv["tokenizer.ggml.tokens"] == [by_id[i] for i in range(vocab.VOCAB_SIZE)]
    special = {added["id"]: added["special"] for added in tok["added_tokens"]}
    types = kv["tokenizer.ggml.token_type"]
    for token_id, kind in enumerate(types):
        if token_id not in special:
            assert kind == NORMAL, token_id
        else:
            assert kind == (CONTROL if special[token_id] else USER_DEFINED), token_id
    assert types[vocab.think_selector(3)] == USER_DEFINED and types[vocab.THINK] == USER_DEFINED
    assert types[vocab.ASSISTANT] == CONTROL and types[vocab.EOS] == CONTROL
    assert kv["tokenizer.ggml.merges"] == [" ".join(pair) for pair in tok["model"]["merges"]]
    assert kv["tokenizer.ggml.bos_token_id"] == vocab.BOS
    assert kv["tokenizer.ggml.eos_token_id"] == vocab.EOS
    assert kv["tokenizer.ggml.padding_token_id"] == vocab.PAD
    assert kv["tokenizer.ggml.add_bos_token"] is tok_config["add_bos_token"] is True
    assert kv["tokenizer.ggml.add_eos_token"] is tok_config["add_eos_token"] is False
    assert kv["tokenizer.chat_template"] == tok_config["chat_template"]


def test_tensor_names_shapes_and_types(
    exported: dict[str, GgufFile], hf_tensors: dict[str, tuple[list[int], bytes]]
) -> None:
    for dtype, file in exported.items():
        assert sorted(file.tensors) == sorted(gguf.gguf_name(name) for name in hf_tensors)
        for hf_name, (shape, _) in hf_tensors.items():
            info = file.tensors[gguf.gguf_name(hf_name)]
            assert list(info.dims) == shape[::-1], hf_name  # ggml: innermost dimension first
            one_d = len(shape) == 1
            assert info.kind == (F32 if one_d or dtype == "f32" else BF16), (dtype, hf_name)
    assert gguf.gguf_name("model.layers.1.self_attn.o_proj.weight") == "blk.1.attn_output.weight"
    assert gguf.gguf_name("lm_head.weight") == "output.weight"


@pytest.mark.parametrize("proj,n_head", [("q_proj", weights.NUM_HEADS), ("k_proj", 2)])
@pytest.mark.parametrize("layer", range(weights.NUM_LAYERS))
def test_qk_rows_are_permuted_for_ggml_rope(
    exported: dict[str, GgufFile],
    hf_tensors: dict[str, tuple[list[int], bytes]],
    proj: str,
    layer: int,
    n_head: int,
) -> None:
    """GGUF row 2i + j of a head is HF row j * 64 + i (rotate-half pairs -> adjacent pairs)."""
    name = f"model.layers.{layer}.self_attn.{proj}.weight"
    shape, data = hf_tensors[name]
    hf_rows = _bf16_rows(data, shape[1])
    for dtype, file in exported.items():
        raw = file.tensor_bytes(gguf.gguf_name(name))
        rows = _f32_rows(raw, shape[1]) if dtype == "f32" else _bf16_rows(raw, shape[1])
        half = HEAD_DIM // 2
        for head in range(n_head):
            for i in range(half):
                for j in (0, 1):
                    got = rows[head * HEAD_DIM + 2 * i + j]
                    assert got == hf_rows[head * HEAD_DIM + j * half + i], (dtype, head, i, j)


def test_selector_query_lands_on_ggml_slow_rope_pair(
    exported: dict[str, GgufFile], hf_tensors: dict[str, tuple[list[int], bytes]]
) -> None:
    """The think head (layer 0, head 5) queries HF dim 63 (pair 63/127); in ggml's layout the
    pair is 126/127, so the non-zero row moves from 63 to 126 and nothing else is non-zero."""
    name = "model.layers.0.self_attn.q_proj.weight"
    shape, data = hf_tensors[name]
    base = 5 * HEAD_DIM

    def nonzero_rows(rows: list[tuple[float, ...]]) -> list[int]:
        return [r - base for r in range(base, base + HEAD_DIM) if any(rows[r])]

    hf_rows = _bf16_rows(data, shape[1])
    gguf_rows = _f32_rows(exported["f32"].tensor_bytes("blk.0.attn_q.weight"), shape[1])
    assert nonzero_rows(hf_rows) == [63]
    assert nonzero_rows(gguf_rows) == [126]


def test_other_tensors_are_the_hf_values(
    exported: dict[str, GgufFile], hf_tensors: dict[str, tuple[list[int], bytes]]
) -> None:
    for hf_name, (shape, data) in hf_tensors.items():
        if hf_name.endswith(("q_proj.weight", "k_proj.weight")):
            continue
        for dtype, file in exported.items():
            raw = file.tensor_bytes(gguf.gguf_name(hf_name))
            if file.tensors[gguf.gguf_name(hf_name)].kind == BF16:
                assert raw == data, (dtype, hf_name)
            else:
                assert raw == gguf.bf16_to_f32(data), (dtype, hf_name)
                width = shape[-1]
                assert _f32_rows(raw[: 4 * width], width) == _bf16_rows(data[: 2 * width], width)


def test_export_is_deterministic(tmp_path: Path) -> None:
    for dtype in gguf.DTYPES:
        first = gguf.export(tmp_path / f"a-{dtype}.gguf", dtype=dtype)
        second = gguf.export(tmp_path / f"b-{dtype}.gguf", dtype=dtype)
        assert first == second
        raw = (tmp_path / f"a-{dtype}.gguf").read_bytes()
        assert raw == (tmp_path / f"b-{dtype}.gguf").read_bytes()
        assert hashlib.sha256(raw).hexdigest() == first
    assert not list(tmp_path.glob(".*.partial"))


def test_cli_export_and_bad_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "scripted.gguf"
    argv = ["model", "export", "--format", "gguf", "--variant", "scripted", "--out", str(out)]
    assert parity_main(argv) == 0
    digest = capsys.readouterr().out.split()[0]
    assert digest == hashlib.sha256(out.read_bytes()).hexdigest()
    assert parity_main([*argv[:-1], str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a folder" in err and str(tmp_path) in err
    with pytest.raises(gguf.ExportError, match="bf8"):
        gguf.gguf_bytes("scripted", "bf8")
    with pytest.raises(gguf.ExportError, match="random"):
        gguf.gguf_bytes("random")
