"""Named test models, built on demand into the project's models folder.

A scenario names its model (``config.model``: ``scripted`` by default, or ``random``); the
folder is ``<models>/<name>`` (``[parity] models``, default ``.cache/models``), built by
``contract.scripted.builder`` the first time it is needed (deterministic: the same bytes every
time; ``parity model build`` does it up front). Any other ``config.model`` is a folder path,
used as is. ``ensure_gguf`` gives the GGUF export of a built model folder (for llama.cpp-based
servers), made next to it on first use.
"""

from __future__ import annotations

import threading
from pathlib import Path

from contract.scripted.builder import VARIANTS

_LOCK = threading.Lock()
GGUF_NAME = "model.gguf"
GGUF_VARIANT = "scripted"  # the one variant contract.scripted.gguf exports


def ensure_model(folder: Path) -> Path:
    """``folder``, built first when it is a named model of a models folder that is missing."""
    if (folder / "config.json").is_file() or folder.name not in VARIANTS:
        return folder
    with _LOCK:
        if not (folder / "config.json").is_file():
            from contract.scripted.builder import build

            build(folder.name, folder)
    return folder


def has_gguf(folder: Path) -> bool:
    """Whether ``ensure_gguf`` can give a GGUF file of ``folder`` (it has one, or it is the
    scripted model, the one variant ``contract.scripted.gguf`` exports)."""
    return (folder / GGUF_NAME).is_file() or folder.name == GGUF_VARIANT


def ensure_gguf(folder: Path) -> Path:
    """The GGUF file of a named model folder (``<folder>/model.gguf``), exported on first use
    (``contract.scripted.gguf``: the scripted variant; float32)."""
    target = folder / GGUF_NAME
    if target.is_file():
        return target
    with _LOCK:
        if not target.is_file():
            from contract.scripted.gguf import export

            export(target, variant=ensure_model(folder).name)
    return target
