"""Paths shared by the repro tests (importable; conftest.py is not)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
HANGS = ROOT / "scenarios" / "hangs"
FAKE_SERVER = ROOT / "tests" / "parity" / "serve" / "fake_server.py"


def fake_target() -> str:
    """The stdlib fake server (tests/parity/serve/fake_server.py) as an ``external:`` target."""
    return f"external:{sys.executable} {FAKE_SERVER} --port {{port}}"
