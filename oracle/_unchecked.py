"""TEST-ONLY: disable the pinned vLLM's startup KV capacity check in this process.

Imported by ``oracle/_site/sitecustomize.py`` when ``VLLM_PARITY_ORACLE_UNCHECKED=1`` (set by
``oracle_env(unchecked=True)``), so every process of the oracle server gets it, the spawned
EngineCore included. It replaces ``_check_enough_kv_cache_memory`` of
``vllm/v1/core/kv_cache_utils.py`` (pin 0.32.0, defined at :1003, called at :2642 from
``get_kv_cache_configs``) with a function that only logs, right after that module is imported.

With it, a config such as ``--num-gpu-blocks-override 2 --block-size 32 --max-model-len 2048``
starts, and the port's self-preemption wedge (docs/failure-classes.md) can be reproduced on upstream
over HTTP. Targets started this way are labelled ``oracle[unchecked]``: never use it for parity.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

TARGET_MODULE = "vllm.v1.core.kv_cache_utils"
TARGET_FUNCTION = "_check_enough_kv_cache_memory"
BANNER = "vllm-parity: oracle[unchecked]: startup KV capacity check DISABLED (test-only)"


def _unchecked(*args: Any, **kwargs: Any) -> None:
    print(BANNER, file=sys.stderr, flush=True)


def patch(module: ModuleType) -> None:
    """Replace the capacity check of an imported kv_cache_utils module."""
    if not hasattr(module, TARGET_FUNCTION):
        raise RuntimeError(f"{TARGET_MODULE}.{TARGET_FUNCTION} not found: pin changed?")
    setattr(module, TARGET_FUNCTION, _unchecked)


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != TARGET_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader)
        return spec


def install() -> None:
    """Patch now if the module is already imported, else when it is."""
    if TARGET_MODULE in sys.modules:
        patch(sys.modules[TARGET_MODULE])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


install()
