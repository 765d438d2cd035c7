"""Build a scripted or random test model folder (``parity model build``; ``make model``).

Upstream: none; the folder is a standard Hugging Face checkpoint (``config.json``,
``model.safetensors``, tokenizer files) that transformers, vLLM and our engine load.

- ``scripted``: the constructed weights of ``contract/scripted/weights.py``; standard library only,
  a fraction of a second.
- ``random``: the same architecture and tokenizer with seeded random bfloat16 weights (norm
  weights too), for comparing prompt logprobs within a tolerance and exercising MLP/norm math.
  Needs torch.

Both are deterministic: the same variant and seed give byte-identical files.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

from contract.scripted import tokenizer, vocab, weights

VARIANTS = ("scripted", "random")
SAFETENSORS_NAME = "model.safetensors"
RANDOM_LM_HEAD_GAIN = 6.0


class BuildError(ValueError):
    """A bad build request (renders as one line)."""


def model_config() -> dict[str, Any]:
    """``config.json``: a LlamaForCausalLM of the scripted model's shape."""
    rope_theta = 1_000_000.0
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab.VOCAB_SIZE,
        "hidden_size": weights.HIDDEN,
        "intermediate_size": weights.INTERMEDIATE,
        "num_hidden_layers": weights.NUM_LAYERS,
        "num_attention_heads": weights.NUM_HEADS,
        "num_key_value_heads": weights.NUM_KV_HEADS,
        "head_dim": weights.HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": tokenizer.MODEL_MAX_LENGTH,
        "rms_norm_eps": 1e-5,
        "rope_theta": rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "use_cache": True,
        "bos_token_id": vocab.BOS,
        "eos_token_id": vocab.EOS,
        "pad_token_id": vocab.PAD,
        "torch_dtype": "bfloat16",
        "dtype": "bfloat16",
    }


def safetensors_bytes(tensors: dict[str, tuple[tuple[int, ...], bytes]]) -> bytes:
    """A safetensors file of bfloat16 tensors (name -> (shape, little-endian bytes)).

    Layout: u64 header length, JSON header (padded with spaces to 8 bytes), then the tensors
    back to back in name order.
    """
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in sorted(tensors):
        shape, data = tensors[name]
        if len(data) != 2 * math.prod(shape):
            raise ValueError(f"{name}: {len(data)} bytes for bf16 shape {shape}")
        header[name] = {
            "dtype": "BF16",
            "shape": list(shape),
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)
    parts = [len(encoded).to_bytes(8, "little"), encoded]
    parts += [tensors[name][1] for name in sorted(tensors)]
    return b"".join(parts)


def _scripted_weights() -> bytes:
    built = weights.scripted_tensors()
    return safetensors_bytes({name: (t.shape, bytes(t.data)) for name, t in built.items()})


def _random_weights(seed: int) -> bytes:
    """Seeded random bf16 weights: N(0, 1) embeddings, N(0, 1/fan_in) projections, N(1, 0.1)
    norms, and an lm_head scaled by ``RANDOM_LM_HEAD_GAIN`` so the next-token distribution is
    peaked like a real model's (logit std ~6) rather than near uniform."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, tuple[tuple[int, ...], bytes]] = {}
    for name, shape in weights.tensor_shapes():
        sample = torch.randn(shape, generator=generator, dtype=torch.float32)
        if name.endswith("norm.weight"):
            sample = 1.0 + 0.1 * sample
        elif name != "model.embed_tokens.weight":
            sample = sample / math.sqrt(shape[1])
        if name == "lm_head.weight":
            sample = sample * RANDOM_LM_HEAD_GAIN
        raw = sample.to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()
        tensors[name] = (shape, raw)
    return safetensors_bytes(tensors)


def model_files(variant: str, seed: int = 0) -> dict[str, bytes]:
    """Every file of a model folder, by name, as bytes."""
    if variant not in VARIANTS:
        raise BuildError(f"unknown model variant {variant!r}: choose one of {', '.join(VARIANTS)}")
    files = {"config.json": tokenizer.dump_json(model_config())}
    files.update(tokenizer.tokenizer_files())
    files[SAFETENSORS_NAME] = (
        _scripted_weights() if variant == "scripted" else _random_weights(seed)
    )
    return files


def build(variant: str, out: str | os.PathLike[str], seed: int = 0) -> dict[str, str]:
    """Write a model folder to ``out`` and return {file name: sha256 hex} of what was written.

    ``seed`` only affects the random variant. Each file is written to a temporary name and
    renamed, so an interrupted build never leaves a truncated checkpoint behind; the name is
    the process's own, so processes building one folder at once (pytest-xdist workers) do not
    rename each other's files (the bytes are the same, the last rename wins).
    """
    files = model_files(variant, seed)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    digests: dict[str, str] = {}
    # model.safetensors last: its mtime is what `make model` checks.
    for name, data in sorted(files.items(), key=lambda item: item[0] == SAFETENSORS_NAME):
        partial = folder / f".{name}.{os.getpid()}.partial"
        partial.write_bytes(data)
        partial.replace(folder / name)
        digests[name] = hashlib.sha256(data).hexdigest()
    return digests
