"""Export the scripted model as a GGUF v3 file for llama.cpp (``parity model export``).

Upstream: the layout is gguf-py's ``GGUFWriter`` (``gguf-py/gguf/gguf_writer.py``: header, KV
pairs, tensor infos, data aligned to ``general.alignment`` = 32) and the metadata is what
llama.cpp's converter writes for a ``LlamaForCausalLM`` with a GPT-2 style BPE tokenizer
(``conversion/llama.py`` ``LlamaModel``, ``conversion/base.py`` ``set_gguf_parameters``,
``get_vocab_base``, ``_set_vocab_gpt2``; ``gguf-py/gguf/vocab.py`` ``SpecialVocab``), all as
vendored by llama-cpp-python 0.3.36. Standard library only; the same bytes every run.

Three choices differ from running the converter on the HF folder, each on purpose:

- q/k rows are permuted as ``LlamaModel.permute`` does (HF's rotate-half RoPE pairs dims i and
  i + 64 of a head; ggml's normal RoPE pairs 2i and 2i + 1), so the selector heads' slow RoPE
  dims 62/63 (HF) become 124/126 and their partners 125/127.
- Added tokens are CONTROL when HF marks them special and USER_DEFINED otherwise. The converter
  also makes every ``<|...|>`` token CONTROL (``does_token_look_special``), which would hide
  the selectors (``<|think:K|>``, ``<|answer:M|>``, ``<|loop|>``, ``<|utf8|>``) from decoded
  text, unlike HF, where they are not special.
- ``tokenizer.ggml.pre`` is ``gpt-2`` by choice, not by the converter's hash of a probe text
  (our vocabulary is too small to match any): the HF tokenizer's ``ByteLevel`` pre-tokenizer
  (``use_regex``) splits with GPT-2's regex, which is what llama.cpp's ``gpt-2`` pre-type runs
  (``src/llama-vocab.cpp`` ``LLAMA_VOCAB_PRE_TYPE_GPT2``, ``src/unicode.cpp``
  ``unicode_regex_split_custom_gpt2``, with the final ``\\s+`` alternative).
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Iterator
from enum import IntEnum
from pathlib import Path

from contract.scripted import builder, tokenizer, vocab, weights

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGNMENT = 32
ARCH = "llama"
DTYPES = ("f32", "bf16")
GGUF_NAME = "scripted"


class ValueType(IntEnum):
    """GGUF metadata value types (``GGUFValueType``)."""

    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9


class TensorType(IntEnum):
    """ggml tensor types used here (``GGMLQuantizationType``)."""

    F32 = 0
    BF16 = 30


class TokenType(IntEnum):
    """llama.cpp token types (``TokenType``)."""

    NORMAL = 1
    CONTROL = 3
    USER_DEFINED = 4


# general.file_type (``LlamaFileType``): ALL_F32, MOSTLY_BF16 (1-D tensors stay F32).
FILE_TYPES = {"f32": 0, "bf16": 32}
MATRIX_TYPES = {"f32": TensorType.F32, "bf16": TensorType.BF16}

# HF tensor name suffix -> GGUF name (``gguf-py/gguf/constants.py`` MODEL_TENSOR names).
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_TOP_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


class ExportError(ValueError):
    """A bad export request (renders as one line)."""


Metadata = list[tuple[str, ValueType, object]]


def gguf_name(hf_name: str) -> str:
    """The GGUF tensor name of an HF ``LlamaForCausalLM`` tensor name."""
    if hf_name in _TOP_NAMES:
        return _TOP_NAMES[hf_name]
    _, _, layer, suffix = hf_name.split(".", 3)
    return f"blk.{layer}.{_LAYER_NAMES[suffix]}"


def permute_rows(data: bytes, rows: int, n_head: int) -> bytes:
    """Reorder the rows of a q/k projection from HF's rotate-half RoPE layout to ggml's
    interleaved one (``LlamaModel.permute``): within each head of ``rows // n_head`` rows,
    row ``j * half + i`` moves to ``2 * i + j``."""
    width = len(data) // rows
    head_dim = rows // n_head
    half = head_dim // 2
    out: list[bytes] = []
    for head in range(n_head):
        base = head * head_dim
        for i in range(half):
            for j in (0, 1):
                row = base + j * half + i
                out.append(data[row * width : (row + 1) * width])
    return b"".join(out)


def bf16_to_f32(data: bytes) -> bytes:
    """Little-endian bfloat16 values widened to float32 (exact: the low 16 bits are zero)."""
    out = bytearray(2 * len(data))
    out[2::4] = data[0::2]
    out[3::4] = data[1::2]
    return bytes(out)


def token_strings() -> list[str]:
    """Every token's GGUF text by id: byte-level BPE strings, then the added tokens' contents."""
    strings = [""] * vocab.VOCAB_SIZE
    for text, token_id in vocab.bpe_vocab().items():
        strings[token_id] = text
    for token_id, content, _ in vocab.ADDED_TOKENS:
        strings[token_id] = content
    assert all(strings), "every id has a token"
    return strings


def token_types() -> list[int]:
    """NORMAL for the BPE vocabulary; CONTROL / USER_DEFINED for HF's special / other added."""
    types = [int(TokenType.NORMAL)] * vocab.VOCAB_SIZE
    for token_id, _, special in vocab.ADDED_TOKENS:
        types[token_id] = int(TokenType.CONTROL if special else TokenType.USER_DEFINED)
    return types


def metadata(dtype: str) -> Metadata:
    """The KV pairs, in the converter's order (general, hyper-parameters, tokenizer)."""
    config = builder.model_config()
    prefix = ARCH + "."
    return [
        ("general.architecture", ValueType.STRING, ARCH),
        ("general.type", ValueType.STRING, "model"),
        ("general.name", ValueType.STRING, GGUF_NAME),
        (prefix + "block_count", ValueType.UINT32, config["num_hidden_layers"]),
        (prefix + "context_length", ValueType.UINT32, config["max_position_embeddings"]),
        (prefix + "embedding_length", ValueType.UINT32, config["hidden_size"]),
        (prefix + "feed_forward_length", ValueType.UINT32, config["intermediate_size"]),
        (prefix + "attention.head_count", ValueType.UINT32, config["num_attention_heads"]),
        (prefix + "attention.head_count_kv", ValueType.UINT32, config["num_key_value_heads"]),
        (prefix + "rope.freq_base", ValueType.FLOAT32, config["rope_theta"]),
        (prefix + "attention.layer_norm_rms_epsilon", ValueType.FLOAT32, config["rms_norm_eps"]),
        (prefix + "attention.key_length", ValueType.UINT32, config["head_dim"]),
        (prefix + "attention.value_length", ValueType.UINT32, config["head_dim"]),
        ("general.file_type", ValueType.UINT32, FILE_TYPES[dtype]),
        (prefix + "vocab_size", ValueType.UINT32, config["vocab_size"]),
        (prefix + "rope.dimension_count", ValueType.UINT32, config["head_dim"]),
        ("tokenizer.ggml.model", ValueType.STRING, "gpt2"),
        ("tokenizer.ggml.pre", ValueType.STRING, "gpt-2"),
        ("tokenizer.ggml.tokens", ValueType.ARRAY, (ValueType.STRING, token_strings())),
        ("tokenizer.ggml.token_type", ValueType.ARRAY, (ValueType.INT32, token_types())),
        ("tokenizer.ggml.merges", ValueType.ARRAY, (ValueType.STRING, _merge_strings())),
        ("tokenizer.ggml.bos_token_id", ValueType.UINT32, vocab.BOS),
        ("tokenizer.ggml.eos_token_id", ValueType.UINT32, vocab.EOS),
        ("tokenizer.ggml.padding_token_id", ValueType.UINT32, vocab.PAD),
        # SpecialVocab: the TemplateProcessing post-processor adds BOS, nothing adds SEP/EOS.
        ("tokenizer.ggml.add_bos_token", ValueType.BOOL, True),
        ("tokenizer.ggml.add_sep_token", ValueType.BOOL, False),
        ("tokenizer.ggml.add_eos_token", ValueType.BOOL, False),
        ("tokenizer.chat_template", ValueType.STRING, tokenizer.CHAT_TEMPLATE),
        ("general.quantization_version", ValueType.UINT32, 2),
    ]


def _merge_strings() -> list[str]:
    return [f"{left} {right}" for left, right in vocab.bpe_merges()]


def tensors(dtype: str) -> Iterator[tuple[str, tuple[int, ...], TensorType, bytes]]:
    """(GGUF name, GGUF dims (innermost first), type, data) of every tensor, in file order:
    the embedding, each block, the final norm, the output head."""
    built = weights.scripted_tensors()
    order = ["model.embed_tokens.weight"]
    for layer in range(weights.NUM_LAYERS):
        order += [f"model.layers.{layer}.{suffix}" for suffix in _LAYER_NAMES]
    order += ["model.norm.weight", "lm_head.weight"]
    assert sorted(order) == sorted(built)
    for hf_name in order:
        tensor = built[hf_name]
        data = bytes(tensor.data)
        if hf_name.endswith("q_proj.weight"):
            data = permute_rows(data, tensor.shape[0], weights.NUM_HEADS)
        elif hf_name.endswith("k_proj.weight"):
            data = permute_rows(data, tensor.shape[0], weights.NUM_KV_HEADS)
        kind = TensorType.F32 if len(tensor.shape) == 1 else MATRIX_TYPES[dtype]
        if kind is TensorType.F32:
            data = bf16_to_f32(data)
        yield gguf_name(hf_name), tuple(reversed(tensor.shape)), kind, data


def _string(text: str) -> bytes:
    encoded = text.encode("utf-8")
    return struct.pack("<Q", len(encoded)) + encoded


def _scalar(kind: ValueType, value: object) -> bytes:
    if kind is ValueType.STRING:
        return _string(str(value))
    fmt = {ValueType.UINT32: "<I", ValueType.INT32: "<i", ValueType.FLOAT32: "<f"}
    if kind is ValueType.BOOL:
        return struct.pack("<?", bool(value))
    return struct.pack(fmt[kind], value)


def _value(kind: ValueType, value: object) -> bytes:
    head = struct.pack("<I", kind)
    if kind is not ValueType.ARRAY:
        return head + _scalar(kind, value)
    assert isinstance(value, tuple), "an array is (item type, items)"
    item_kind, items = value
    body = b"".join(_scalar(item_kind, item) for item in items)
    return head + struct.pack("<IQ", item_kind, len(items)) + body


def _pad(size: int) -> int:
    return -size % ALIGNMENT


def gguf_bytes(variant: str = "scripted", dtype: str = "f32") -> bytes:
    """The whole GGUF file: header, KV pairs, tensor infos, padding, aligned tensor data."""
    if variant != "scripted":
        raise ExportError(f"GGUF export supports the scripted variant only, not {variant!r}")
    if dtype not in DTYPES:
        raise ExportError(f"unknown GGUF dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    kvs = metadata(dtype)
    items = list(tensors(dtype))
    parts = [GGUF_MAGIC, struct.pack("<IQQ", GGUF_VERSION, len(items), len(kvs))]
    parts += [_string(key) + _value(kind, value) for key, kind, value in kvs]
    offset = 0
    for name, dims, kind, data in items:
        info = struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        parts.append(_string(name) + info + struct.pack("<IQ", kind, offset))
        offset += len(data) + _pad(len(data))
    head = b"".join(parts)
    body = [head, bytes(_pad(len(head)))]
    for *_, data in items:
        body += [data, bytes(_pad(len(data)))]
    return b"".join(body)


def export(out: str | os.PathLike[str], variant: str = "scripted", dtype: str = "f32") -> str:
    """Write the GGUF file to ``out`` (via a temporary name, then a rename) and return its
    sha256 hex digest."""
    data = gguf_bytes(variant, dtype)
    path = Path(out)
    if path.is_dir():
        raise ExportError(f"{path}: is a folder; give the output file's name (e.g. scripted.gguf)")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")  # one per writer
    partial.write_bytes(data)
    partial.replace(path)
    return hashlib.sha256(data).hexdigest()
