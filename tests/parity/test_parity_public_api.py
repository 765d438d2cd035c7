"""The package's public surface: every ``__all__`` name resolves, no vllm import on the way."""

from __future__ import annotations

import sys

import pytest
from parity_helpers import run_process

import parity

pytestmark = pytest.mark.timeout(60)


def test_all_names_resolve() -> None:
    assert parity.__all__ == sorted(parity.__all__)
    for name in parity.__all__:
        assert getattr(parity, name) is not None, name


def test_importing_the_harness_does_not_import_vllm() -> None:
    code = "import sys, parity, parity.cli; assert 'vllm' not in sys.modules, 'vllm imported'"
    returncode, _out, err = run_process([sys.executable, "-c", code])
    assert returncode == 0, err
