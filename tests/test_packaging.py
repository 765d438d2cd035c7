"""The distribution: every package of the tree is listed in pyproject.toml, and the wheel
carries what the harness reads at run time (the bundled suites, defaults, templates, the
oracle's sitecustomize folder)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[1]


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_is_listed() -> None:
    listed = set(_setuptools()["packages"])
    found = set(find_packages(str(ROOT), include=["contract*", "engine*", "oracle*", "parity*"]))
    assert found <= listed, f"add to pyproject.toml: {sorted(found - listed)}"
    assert listed - found == {"parity.suites"}  # the data package mapped from scenarios/


def test_run_time_data_is_packaged() -> None:
    config = _setuptools()
    assert config["package-dir"]["parity.suites"] == "scenarios"
    data = config["package-data"]
    assert "defaults.toml" in data["parity"] and "templates/*" in data["parity"]
    assert "_site/*.py" in data["oracle"]
    for name in ("defaults.toml", "templates/parity.toml"):
        assert (ROOT / "parity" / name).is_file()
    assert (ROOT / "oracle" / "_site" / "sitecustomize.py").is_file()
