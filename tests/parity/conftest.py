"""Fixtures for the parity harness tests: scenario files, synthetic traces, targets."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from parity_helpers import make_trace

from contract.trace import StepTrace


@pytest.fixture
def trace() -> Callable[..., StepTrace]:
    return make_trace


@pytest.fixture
def write_yaml(tmp_path: Path) -> Callable[[str, str], Path]:
    """``write_yaml(name, text)`` -> ``tmp_path/<name>.yaml``."""

    def write(name: str, text: str) -> Path:
        path = tmp_path / f"{name}.yaml"
        path.write_text(text, encoding="utf-8")
        return path

    return write


@pytest.fixture
def engine_target(scripted_model_dir: Path) -> Iterator[Any]:
    from parity.targets import make_target

    target = make_target(f"engine:{scripted_model_dir}")
    yield target
    target.close()


@pytest.fixture(scope="session")
def oracle_target(scripted_model_dir: Path) -> Iterator[Any]:
    """The in-process upstream scheduler (one vllm import per test session)."""
    from parity.targets import make_target

    target = make_target(f"oracle:{scripted_model_dir}")
    yield target
    target.close()


def _worker(name: str, module: str, model_dir: Path) -> Any:
    import sys

    from parity_helpers import ROOT

    from parity.targets.worker import WorkerTarget

    argv = [sys.executable, "-m", module]
    return WorkerTarget(name, argv, cwd=ROOT, model_dir=model_dir, start_timeout_s=600)


@pytest.fixture(scope="session")
def engine_worker(scripted_model_dir: Path) -> Iterator[Any]:
    """Our engine behind the worker protocol (``python -m engine.core.scheduler_worker``)."""
    target = _worker("engine-worker", "engine.core.scheduler_worker", scripted_model_dir)
    yield target
    target.shutdown()


@pytest.fixture(scope="session")
def oracle_worker(scripted_model_dir: Path) -> Iterator[Any]:
    """The pinned upstream scheduler behind the worker protocol (one vllm import, in the
    worker process, per test session)."""
    target = _worker("oracle-worker", "oracle.scheduler_worker", scripted_model_dir)
    yield target
    target.shutdown()
