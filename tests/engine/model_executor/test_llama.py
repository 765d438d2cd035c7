"""Config parsing, checkpoint loading and the Llama forward pass against transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.model_executor.attention import AttentionMetadata, PrefillSpan
from engine.model_executor.linear import KERNELS, TRIALS, Linear
from engine.model_executor.llama import LlamaConfig, UnsupportedModelError
from engine.model_executor.loader import ModelLoadError, load_config, load_model

pytestmark = pytest.mark.timeout(120)

BASE = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 96,
    "hidden_size": 64,
    "intermediate_size": 80,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 256,
}


def test_config_layouts() -> None:
    v4 = LlamaConfig.from_hf({**BASE, "rope_theta": 5e5})
    assert (v4.num_key_value_heads, v4.head_dim, v4.rope_theta) == (4, 16, 5e5)
    v5 = LlamaConfig.from_hf(
        {**BASE, "num_key_value_heads": 2, "head_dim": 32, "rope_parameters": {"rope_theta": 1e6}}
    )
    assert (v5.num_key_value_heads, v5.head_dim, v5.rope_theta) == (2, 32, 1e6)
    assert not v5.tie_word_embeddings


@pytest.mark.parametrize(
    "change, message",
    [
        ({"architectures": ["MistralForCausalLM"]}, "unsupported architecture"),
        ({"hidden_act": "gelu"}, "unsupported hidden_act"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "unsupported rope scaling"),
    ],
)
def test_unsupported_configs(change: dict, message: str) -> None:
    with pytest.raises(UnsupportedModelError, match=message):
        LlamaConfig.from_hf({**BASE, **change})


def test_loader_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="config.json: no such file"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(ModelLoadError, match="invalid JSON"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ModelLoadError, match="missing field"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(BASE))
    with pytest.raises(ModelLoadError, match="no model.safetensors"):
        load_model(tmp_path)


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A tiny tied-embedding GQA Llama with head_dim != hidden/heads, saved in shards."""
    from transformers import LlamaConfig as HFConfig
    from transformers import LlamaForCausalLM as HFModel

    torch.manual_seed(0)
    config = HFConfig(
        **{k: v for k, v in BASE.items() if k != "architectures"},
        num_key_value_heads=2,
        head_dim=32,
        rope_theta=10_000.0,
        tie_word_embeddings=True,
    )
    model = HFModel(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    out = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(out, max_shard_size="100KB")
    assert (out / "model.safetensors.index.json").exists()
    return model, out


def prefill_metadata(num_tokens: int, block_size: int = 16) -> AttentionMetadata:
    """One request, all tokens at once, in blocks 1, 2, ..."""
    num_blocks = -(-num_tokens // block_size)
    return AttentionMetadata(
        slot_mapping=torch.arange(num_tokens) + block_size,
        num_decode_tokens=0,
        decode_block_table=None,
        decode_mask=None,
        prefills=[PrefillSpan(0, num_tokens, num_tokens, torch.arange(1, num_blocks + 1), None)],
    )


def kv_caches(model, num_blocks: int = 8, block_size: int = 16):  # type: ignore[no-untyped-def]
    c = model.config
    shape = (num_blocks, block_size, c.num_key_value_heads, c.head_dim)
    return [(torch.zeros(shape), torch.zeros(shape)) for _ in range(c.num_hidden_layers)]


def test_forward_matches_transformers(tiny_hf) -> None:  # type: ignore[no-untyped-def]
    hf_model, folder = tiny_hf
    model = load_model(folder, torch.float32)
    assert model.config.tie_word_embeddings and model.config.head_dim == 32
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    ids = torch.randint(0, 96, (40,), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        expected = hf_model(ids[None]).logits[0]
        hidden = model(ids, torch.arange(40), kv_caches(model), prefill_metadata(40))
        logits = model.compute_logits(hidden)
    assert torch.allclose(logits, expected, atol=1e-4)


def test_the_first_passes_choose_one_kernel_for_every_projection(tiny_hf) -> None:  # type: ignore[no-untyped-def]
    """Every projection shares the model's chooser; the forward passes settle each row range
    they run, and whichever kernel runs, the logits are transformers'."""
    hf_model, folder = tiny_hf
    model = load_model(folder, torch.float32)
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert len(linears) == 4 * 2 + 1  # qkv, o, gate_up, down per layer; lm_head
    assert {id(m.chooser) for m in linears} == {id(model.kernels)}
    assert model.kernels.candidates == KERNELS and model.kernels.settled() == {}
    ids = torch.randint(0, 96, (40,), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        expected = hf_model(ids[None]).logits[0]
        for kernel in [*KERNELS * TRIALS, None]:  # candidates in turn, then the chosen one
            assert kernel is None or model.kernels.kernel(40) == kernel
            hidden = model(ids, torch.arange(40), kv_caches(model), prefill_metadata(40))
            assert torch.allclose(model.compute_logits(hidden), expected, atol=1e-4), kernel
    assert set(model.kernels.settled()) == {"32-63"}
    assert model.kernels.settled()["32-63"] in KERNELS


def test_decode_through_the_cache_matches_full_forward(tiny_hf) -> None:  # type: ignore[no-untyped-def]
    """Prefill 30 tokens, then decode 10 one at a time over the paged cache."""
    hf_model, folder = tiny_hf
    model = load_model(folder, torch.float32)
    ids = torch.randint(0, 96, (40,), generator=torch.Generator().manual_seed(2))
    caches = kv_caches(model)
    with torch.inference_mode():
        expected = hf_model(ids[None]).logits[0]
        model(ids[:30], torch.arange(30), caches, prefill_metadata(30))
        for pos in range(30, 40):
            num_blocks = pos // 16 + 1
            meta = AttentionMetadata(
                slot_mapping=torch.tensor([16 + pos]),
                num_decode_tokens=1,
                decode_block_table=torch.arange(1, num_blocks + 1)[None],
                decode_mask=(torch.arange(num_blocks * 16) <= pos).view(1, 1, 1, -1),
                prefills=[],
            )
            hidden = model(ids[pos : pos + 1], torch.tensor([pos]), caches, meta)
            assert torch.allclose(model.compute_logits(hidden)[0], expected[pos], atol=1e-4)


def test_missing_and_misshapen_weights(tiny_hf, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, folder = tiny_hf
    model = load_model(folder)
    weights = dict(model.named_parameters())
    broken = [(n, p) for n, p in weights.items() if "layers.1.mlp.down_proj" not in n]
    fresh = type(model)(model.config, torch.float32)
    with pytest.raises(UnsupportedModelError, match="missing weights: model.layers.1.mlp.down"):
        fresh.load_weights(broken)
    wrong = [(n, p[:-1] if n == "model.norm.weight" else p) for n, p in weights.items()]
    with pytest.raises(UnsupportedModelError, match="model.norm.weight has shape"):
        type(model)(model.config, torch.float32).load_weights(wrong)
