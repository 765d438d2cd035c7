"""Fixtures for the scripted-model tests: model folders freshly built from the current code.

These shadow the root ``tests/conftest.py`` fixtures of the same name (which reuse
``.cache/models`` when present), so the builder under test is always the one in the tree.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from contract.scripted import vocab
from contract.scripted.builder import build

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def scripted_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scripted model folder built now (a fraction of a second)."""
    out = tmp_path_factory.mktemp("scripted-model")
    build("scripted", out)
    return out


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weights model folder built now (seed 0)."""
    out = tmp_path_factory.mktemp("random-model")
    build("random", out, seed=0)
    return out


@pytest.fixture(scope="session")
def hf_tokenizer(scripted_model_dir: Path):  # -> transformers.PreTrainedTokenizerBase
    """transformers' AutoTokenizer on the built folder (offline)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(scripted_model_dir)


@pytest.fixture(scope="session")
def chat_ids(hf_tokenizer) -> Callable[..., list[int]]:
    """Token ids of a chat prompt rendered by the folder's chat template."""

    def render(user: str, system: str | None = None, **template_kwargs: object) -> list[int]:
        messages = [{"role": "user", "content": user}]
        if system is not None:
            messages.insert(0, {"role": "system", "content": system})
        text = hf_tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **template_kwargs
        )
        ids = hf_tokenizer.encode(text, add_special_tokens=False)
        assert ids[0] == vocab.BOS and ids.count(vocab.BOS) == 1
        return list(ids)

    return render
