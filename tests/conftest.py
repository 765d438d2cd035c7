"""Shared fixtures: the built test models.

``make test`` builds the models into ``.cache/models`` first; when a test runs without them
(e.g. plain ``pytest`` on a fresh clone) they are built into a temporary folder instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / ".cache" / "models"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _model_dir(variant: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = MODELS / variant
    if (built / "model.safetensors").exists():
        return built
    from contract.scripted.builder import build

    out = tmp_path_factory.mktemp(f"model-{variant}")
    build(variant, out)
    return out


@pytest.fixture(scope="session")
def scripted_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scripted model folder (greedy output known in advance: contract.scripted.script)."""
    return _model_dir("scripted", tmp_path_factory)


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The random-weights variant (same architecture and tokenizer)."""
    return _model_dir("random", tmp_path_factory)
