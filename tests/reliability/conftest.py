"""Factories for the reliability tests: engine servers of the scripted model.

``reliability_server(*flags, **engine_args)`` starts one ``python -m engine serve`` (through
``parity.serve.ServerPool``: own process group, bounded health wait, reaped with SIGTERM, a
grace period, then SIGKILL, and the whole group checked gone with psutil). The module-scoped
form serves a whole test module. Scale: ``RELIABILITY_SCALE`` (reliability_support.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from reliability_support import engine_server, scripted_config

from parity.serve import ServerHandle

ServerFactory = Callable[..., contextlib.AbstractContextManager[ServerHandle]]


def _factory(model_dir: Path, log_dir: Callable[[], Path]) -> ServerFactory:
    def start(*flags: str, **engine_args: Any) -> contextlib.AbstractContextManager[ServerHandle]:
        return engine_server(log_dir(), scripted_config(model_dir, *flags, **engine_args))

    return start


@pytest.fixture
def reliability_server(scripted_model_dir: Path, tmp_path: Path) -> ServerFactory:
    """``with reliability_server(*flags, **engine_args) as handle``: a server for one test."""
    counter = iter(range(1_000))
    return _factory(scripted_model_dir, lambda: tmp_path / f"servers-{next(counter)}")


@pytest.fixture(scope="module")
def module_server_factory(
    scripted_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> ServerFactory:
    """Like ``reliability_server``, for module-scoped fixtures."""
    return _factory(scripted_model_dir, lambda: tmp_path_factory.mktemp("servers"))


@pytest.fixture(scope="module")
def fuzz_server(module_server_factory: ServerFactory) -> Iterator[ServerHandle]:
    """The fuzz target: block size 16, max_model_len 128 (so no valid request is long)."""
    with module_server_factory(block_size=16, max_model_len=128) as handle:
        yield handle
