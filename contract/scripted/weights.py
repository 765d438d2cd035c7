"""Constructed weights that realise the script (docs/scripted-model.md, "Construction").

Upstream: the tensor names and shapes are those of transformers' ``LlamaForCausalLM``
(``transformers/models/llama/modeling_llama.py``) and vLLM's ``vllm/model_executor/models/
llama.py`` loader; the values are ours. Standard library only.

Residual stream (hidden 1024)::

    dims 0..511    current token: embedding = 32 * one-hot (RMSNorm with weight 1 keeps it)
    dims 512..1022 OUT slots: OUT[s] = 512 + s holds attention's votes for next token s
    dim 1023       constant 1.0 in every embedding (the OUT slot of <|reserved_21|>, never voted
                   for); lm_head reads the 'A'..'T' score ladder from it

All MLP weights are zero and norms are one, so the residual passes through. Each selector head
(``script.SELECTOR_HEADS``) uses one of the two slowest RoPE frequencies (index 63 for the think
family, 62 for the answer family, paired with dims 127/126 by HF's ``rotate_half``): at
rope_theta 1e6 they turn by at most 0.013 rad over 8,192 positions, so the lookup ignores
position. Its query is +16 there when the current token is a query token and -16 otherwise;
selectors put key 24 in their family's dim (score +-24*16/sqrt(128) = +-33.9, every other key 0);
selector i's value is 1.0 in slot i of the KV head; o_proj maps slot i to the head's votes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from contract.scripted import script, vocab
from contract.scripted.vocab import Family

HIDDEN = 1024
NUM_LAYERS = 2
NUM_HEADS = 8
NUM_KV_HEADS = 2
HEAD_DIM = 128
INTERMEDIATE = 1024
VOCAB = vocab.VOCAB_SIZE

EMBED_SCALE = 32.0
OUT_BASE = VOCAB
CONST_DIM = HIDDEN - 1
CONST_VALUE = 1.0
OUT_SCALE = 64.0  # lm_head weight on OUT[s]: a vote of v logits is v / 64 in the residual
QUERY = 16.0
KEY = 24.0
ROPE_INDEX = {Family.THINK: 63, Family.ANSWER: 62}


def bf16_bits(value: float) -> int:
    """The bfloat16 bit pattern of ``value``, which must be exactly representable."""
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    if bits & 0xFFFF:
        raise ValueError(f"{value!r} is not exactly representable in bfloat16")
    return int(bits >> 16)


@dataclass
class Bf16Tensor:
    """A zero-initialised little-endian bfloat16 tensor that entries can be set in."""

    shape: tuple[int, ...]
    data: bytearray

    @classmethod
    def zeros(cls, *shape: int) -> Bf16Tensor:
        size = 1
        for dim in shape:
            size *= dim
        return cls(shape, bytearray(2 * size))

    @classmethod
    def filled(cls, value: float, *shape: int) -> Bf16Tensor:
        tensor = cls.zeros(*shape)
        tensor.data[:] = struct.pack("<H", bf16_bits(value)) * (len(tensor.data) // 2)
        return tensor

    def set(self, row: int, col: int, value: float) -> None:
        rows, cols = self.shape
        if not (0 <= row < rows and 0 <= col < cols):
            raise IndexError(f"({row}, {col}) outside {self.shape}")
        struct.pack_into("<H", self.data, 2 * (row * cols + col), bf16_bits(value))

    def get(self, row: int, col: int) -> float:
        (bits,) = struct.unpack_from("<H", self.data, 2 * (row * self.shape[1] + col))
        return float(struct.unpack("<f", struct.pack("<I", bits << 16))[0])

    def add(self, row: int, col: int, value: float) -> None:
        self.set(row, col, self.get(row, col) + value)


def tensor_shapes() -> Iterator[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every tensor of the checkpoint, in the order they are stored."""
    shapes: dict[str, tuple[int, ...]] = {
        "lm_head.weight": (VOCAB, HIDDEN),
        "model.embed_tokens.weight": (VOCAB, HIDDEN),
        "model.norm.weight": (HIDDEN,),
    }
    for layer in range(NUM_LAYERS):
        prefix = f"model.layers.{layer}."
        shapes[prefix + "input_layernorm.weight"] = (HIDDEN,)
        shapes[prefix + "post_attention_layernorm.weight"] = (HIDDEN,)
        shapes[prefix + "self_attn.q_proj.weight"] = (NUM_HEADS * HEAD_DIM, HIDDEN)
        shapes[prefix + "self_attn.k_proj.weight"] = (NUM_KV_HEADS * HEAD_DIM, HIDDEN)
        shapes[prefix + "self_attn.v_proj.weight"] = (NUM_KV_HEADS * HEAD_DIM, HIDDEN)
        shapes[prefix + "self_attn.o_proj.weight"] = (HIDDEN, NUM_HEADS * HEAD_DIM)
        shapes[prefix + "mlp.gate_proj.weight"] = (INTERMEDIATE, HIDDEN)
        shapes[prefix + "mlp.up_proj.weight"] = (INTERMEDIATE, HIDDEN)
        shapes[prefix + "mlp.down_proj.weight"] = (HIDDEN, INTERMEDIATE)
    yield from sorted(shapes.items())


def _slot(selector: int) -> int:
    """The value slot (0..92) of a selector inside a KV head."""
    return selector - vocab.THINK_SELECTOR_BASE


def _embedding() -> Bf16Tensor:
    embed = Bf16Tensor.zeros(VOCAB, HIDDEN)
    for token_id in range(VOCAB):
        embed.set(token_id, token_id, EMBED_SCALE)
        embed.set(token_id, CONST_DIM, CONST_VALUE)
    return embed


def _lm_head() -> Bf16Tensor:
    lm_head = Bf16Tensor.zeros(VOCAB, HIDDEN)
    for token_id in range(VOCAB):
        lm_head.set(script.successor(token_id), token_id, script.ORDER1_SCORE / EMBED_SCALE)
        lm_head.add(vocab.UM, token_id, script.UM_SCORE / EMBED_SCALE)
    for target in range(VOCAB):
        if OUT_BASE + target != CONST_DIM:
            lm_head.set(target, OUT_BASE + target, OUT_SCALE)
    for token_id in script.LADDER_TOKENS:
        lm_head.set(token_id, CONST_DIM, script.ladder_score(token_id) / CONST_VALUE)
    return lm_head


def _attention(layer: int) -> dict[str, Bf16Tensor]:
    """q/k/v/o projections of one layer: its selector heads and the KV heads they read."""
    q = Bf16Tensor.zeros(NUM_HEADS * HEAD_DIM, HIDDEN)
    k = Bf16Tensor.zeros(NUM_KV_HEADS * HEAD_DIM, HIDDEN)
    v = Bf16Tensor.zeros(NUM_KV_HEADS * HEAD_DIM, HIDDEN)
    o = Bf16Tensor.zeros(HIDDEN, NUM_HEADS * HEAD_DIM)
    heads = [head for head in script.SELECTOR_HEADS if head.layer == layer]
    for kv_head in sorted({head.head * NUM_KV_HEADS // NUM_HEADS for head in heads}):
        for selector in vocab.SELECTORS:
            family = vocab.selector_family(selector)
            assert family is not None
            k.set(kv_head * HEAD_DIM + ROPE_INDEX[family], selector, KEY / EMBED_SCALE)
            v.set(kv_head * HEAD_DIM + _slot(selector), selector, 1.0 / EMBED_SCALE)
    for head in heads:
        row = head.head * HEAD_DIM + ROPE_INDEX[head.family]
        for token_id in range(VOCAB):
            sign = 1.0 if token_id in head.query_tokens else -1.0
            q.set(row, token_id, sign * QUERY / EMBED_SCALE)
        for selector in vocab.SELECTORS:
            if vocab.selector_family(selector) is not head.family:
                continue
            for target, vote in head.votes(selector):
                assert OUT_BASE + target != CONST_DIM
                o.add(OUT_BASE + target, head.head * HEAD_DIM + _slot(selector), vote / OUT_SCALE)
    return {"q_proj": q, "k_proj": k, "v_proj": v, "o_proj": o}


def scripted_tensors() -> dict[str, Bf16Tensor]:
    """Every tensor of the scripted checkpoint by name."""
    built: dict[str, Bf16Tensor] = {
        "model.embed_tokens.weight": _embedding(),
        "lm_head.weight": _lm_head(),
    }
    for layer in range(NUM_LAYERS):
        for proj, tensor in _attention(layer).items():
            built[f"model.layers.{layer}.self_attn.{proj}.weight"] = tensor
    tensors: dict[str, Bf16Tensor] = {}
    for name, shape in tensor_shapes():
        if name in built:
            tensors[name] = built[name]
        elif name.endswith("norm.weight"):
            tensors[name] = Bf16Tensor.filled(1.0, *shape)
        else:
            tensors[name] = Bf16Tensor.zeros(*shape)
        assert tensors[name].shape == shape, name
    return tensors
