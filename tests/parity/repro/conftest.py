"""Factories for the repro tests: repro files in tmp_path, the CLI in process, the fake server."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import repro_support

from parity.repro.cli import main


@pytest.fixture
def write_repro(tmp_path: Path) -> Callable[[str, str], Path]:
    """``write_repro(id, text)`` -> ``tmp_path/<id>.repro.yaml``."""

    def write(repro_id: str, text: str) -> Path:
        path = tmp_path / f"{repro_id}.repro.yaml"
        path.write_text(text, encoding="utf-8")
        return path

    return write


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """``run_cli(*argv)`` -> (exit code, stdout, stderr) of ``parity repro`` in process."""

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture(scope="session")
def fake_target() -> str:
    """The stdlib fake server (tests/parity/serve/fake_server.py) as an ``external:`` target."""
    return repro_support.fake_target()
