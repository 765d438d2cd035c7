"""Factories for the serve-tier tests: a module-scoped ``ServerPool``, request specs, configs.
Constants and the fake server's target spec are in ``serve_support`` (importable).

Each test module that needs real servers gets one pool (``serve_pool``), closed at module end;
closing asserts that no process the pool started is left. An oracle server may be leased from
the session's server broker (tests/conftest.py) instead of started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from parity.process import signal_group, spawn
from parity.serve import ServerConfig, ServeRequestSpec, ServerPool
from parity.serve.lease import BrokerClient

RequestFactory = Callable[..., ServeRequestSpec]


@pytest.fixture(scope="module")
def serve_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerPool]:
    """One pool per module; at the end every server it started is reaped and its group gone
    (a server leased from the session's broker goes back to the broker)."""
    pool = ServerPool(tmp_path_factory.mktemp("serve-pool"), grace_s=15.0)
    try:
        yield pool
    finally:
        groups = {h.process.pid for h in pool.handles if h.process is not None and not h.leased}
        pool.close()
        left = [p for p in psutil.pids() if _group(p) in groups]
        assert not left, f"processes of the pool's servers left running: {left}"


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[BrokerClient]:
    """A server broker of the test's own (not the session's): waits at most 2 s for a server
    another run holds, keeps at most 2 idle; stopped (its servers with it) at the end."""
    path = tmp_path / "broker.sock"
    argv = [sys.executable, "-m", "parity.serve.broker", "--socket", str(path),
            "--log-dir", str(tmp_path / "broker-logs"), "--wait-s", "2", "--max-idle", "2"]  # fmt: skip
    with open(tmp_path / "broker.log", "wb") as log:
        proc = spawn(argv, env=os.environ, cwd=None, log=log)
    try:
        deadline = time.monotonic() + 60
        while not path.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the broker did not start"
            time.sleep(0.05)
        yield BrokerClient(str(path))
    finally:
        signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            signal_group(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    assert proc.returncode == 0, (tmp_path / "broker.log").read_text()


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
