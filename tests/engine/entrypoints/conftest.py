"""Factories for the serving-layer tests: a server subprocess and an in-process engine.

``ServerProcess`` starts ``python -m engine serve`` in a new process group (never a new
session: docs/oracle-on-cpu.md), on a free port, waits for ``/health`` with a bound, and reaps the
whole group with SIGTERM, a grace period, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[3]
STARTUP_TIMEOUT_S = 120.0
GRACE_S = 10.0
# The flags the module-scoped scripted server runs with (like the oracle's scripted runs).
SCRIPTED_FLAGS = (
    "--block-size", "32", "--max-model-len", "512", "--served-model-name", "scripted",
    "--reasoning-parser", "deepseek_r1", "--dtype", "float32", "--disable-log-stats",
    "--disable-uvicorn-access-log",
)  # fmt: skip


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1")
    env.update(extra)
    return env


@dataclass
class ServerProcess:
    """One ``python -m engine serve`` subprocess."""

    model_dir: Path
    flags: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=server_env)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, log_dir: Path) -> ServerProcess:
        self.log_path = log_dir / f"server-{self.port}.log"
        cmd = [sys.executable, "-m", "engine", "serve", str(self.model_dir), "--port", str(self.port), *self.flags]  # fmt: skip
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, process_group=0
            )
        return self

    def wait_healthy(self, timeout: float = STARTUP_TIMEOUT_S) -> float:
        assert self.proc is not None
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return time.monotonic() - start
            time.sleep(0.2)
        raise AssertionError(f"server not healthy after {timeout} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signum)

    def stop(self, grace: float = GRACE_S) -> int | None:
        """SIGTERM the group, wait ``grace``, then SIGKILL; returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait(GRACE_S)
        self.signal(signal.SIGKILL)  # stragglers in the group
        return self.proc.returncode


@contextlib.contextmanager
def running_server(
    model_dir: Path, log_dir: Path, *flags: str, **env: str
) -> Iterator[ServerProcess]:
    server = ServerProcess(model_dir, tuple(flags), server_env(**env)).start(log_dir)
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


@pytest.fixture
def serve(tmp_path: Path) -> Any:
    """``with serve(model_dir, *flags, **env) as server``: a server for one test."""

    def factory(model_dir: Path, *flags: str, **env: str) -> Any:
        return running_server(model_dir, tmp_path, *flags, **env)

    return factory


@pytest.fixture(scope="module")
def serve_module(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Like ``serve``, for module-scoped servers."""

    def factory(model_dir: Path, *flags: str, **env: str) -> Any:
        return running_server(model_dir, tmp_path_factory.mktemp("server"), *flags, **env)

    return factory


@pytest.fixture(scope="session")
def engine_cli() -> Any:
    """``engine_cli(*argv, timeout=...)``: run ``python -m engine`` to completion."""

    def run(*argv: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "engine", *argv],
            cwd=ROOT, env=server_env(), capture_output=True, text=True, timeout=timeout,
            process_group=0,
        )  # fmt: skip

    return run


@pytest.fixture(scope="module")
def scripted_server(
    scripted_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """The scripted model served once per module (reasoning parser on, M=512, bs 32)."""
    with running_server(
        scripted_model_dir, tmp_path_factory.mktemp("server"), *SCRIPTED_FLAGS
    ) as s:
        yield s


@pytest.fixture(scope="module")
def client(scripted_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=scripted_server.url, timeout=60.0) as c:
        yield c


@pytest.fixture(scope="session")
def sse() -> Any:
    """``sse(text)``: the ``data:`` payloads of an SSE body (framing asserted)."""
    return sse_frames


def sse_frames(text: str) -> list[str]:
    """The ``data:`` payloads of an SSE body, in order (asserting the framing)."""
    assert text.endswith("\n\n"), text[-200:]
    frames = text.split("\n\n")[:-1]
    payloads = []
    for frame in frames:
        assert frame.startswith("data: "), frame
        payloads.append(frame[len("data: ") :])
    return payloads
