"""Factories for the serve-tier tests: a module-scoped ``ServerPool``, request specs, configs.
Constants and the fake server's target spec are in ``serve_support`` (importable).

Each test module that needs real servers gets one pool (``serve_pool``), closed at module end;
closing asserts that no process the pool started is left.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from parity.serve import ServerConfig, ServeRequestSpec, ServerPool

RequestFactory = Callable[..., ServeRequestSpec]


@pytest.fixture(scope="module")
def serve_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerPool]:
    """One pool per module; at the end every server is reaped and its group gone."""
    pool = ServerPool(tmp_path_factory.mktemp("serve-pool"), grace_s=15.0)
    try:
        yield pool
    finally:
        groups = {h.process.pid for h in pool.handles if h.process is not None}
        pool.close()
        left = [p for p in psutil.pids() if _group(p) in groups]
        assert not left, f"processes of the pool's servers left running: {left}"


@pytest.fixture(scope="session")
def make_request() -> RequestFactory:
    """A ``ServeRequestSpec`` with greedy sampling and token ids returned."""

    def factory(request_id: str = "r1", **fields: Any) -> ServeRequestSpec:
        body = {"temperature": 0.0, "return_token_ids": True}
        body.update(fields.pop("body", {}))
        return ServeRequestSpec(id=request_id, body=body, **fields)

    return factory


@pytest.fixture(scope="session")
def scripted_config(scripted_model_dir: Path) -> Callable[..., ServerConfig]:
    """``scripted_config(**engine_args)``: the scripted model, served as ``scripted``."""

    def factory(**engine_args: Any) -> ServerConfig:
        return ServerConfig(
            model=str(scripted_model_dir), engine_args=engine_args, served_model_name="scripted"
        )

    return factory


def _group(pid: int) -> int | None:
    """The process group of a live (not zombie) process, else None."""
    try:
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return None
        return os.getpgid(pid)
    except (psutil.NoSuchProcess, ProcessLookupError, PermissionError):
        return None
