"""The hypothesis profiles of ``tests/conftest.py`` in a real pytest process: under ``ci`` (the
default, what ``make test`` runs) two runs of one property test draw the same examples, in the
same order; under ``deep`` (``make soak``) two runs draw different ones; an unknown profile name
is one clear usage error.

The draws are the ``Test case: ...`` lines hypothesis prints at verbose verbosity, from a real
property test of the suite (fast, pure Python, a large example space).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from parity_helpers import run_process

PROPERTY = "tests/engine/scripted/test_script.py::test_expected_is_greedy_and_prefix_consistent"
_CASE = re.compile(r"^Test case: .*?^\)$", re.MULTILINE | re.DOTALL)


def _draws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, profile: str) -> list[str]:
    monkeypatch.setenv("HYPOTHESIS_PROFILE", profile)
    monkeypatch.setenv("HYPOTHESIS_STORAGE_DIRECTORY", str(tmp_path / "hypothesis"))
    monkeypatch.delenv("CI", raising=False)  # hypothesis would load its own ci profile
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-s"]
    code, out, err = run_process([*argv, "--hypothesis-verbosity=verbose", PROPERTY], 120)
    assert code == 0, out + err
    draws = _CASE.findall(out)
    assert len(draws) >= 100, out[-2000:]  # the test asks for 200 examples
    return draws


@pytest.mark.timeout(300)
def test_ci_profile_draws_the_same_examples_every_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    first = _draws(monkeypatch, tmp_path, "ci")
    assert _draws(monkeypatch, tmp_path, "ci") == first


@pytest.mark.timeout(300)
def test_deep_profile_draws_new_examples_every_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    first = _draws(monkeypatch, tmp_path, "deep")
    assert _draws(monkeypatch, tmp_path, "deep") != first


@pytest.mark.timeout(120)
def test_unknown_profile_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "dep")
    code, out, err = run_process([sys.executable, "-m", "pytest", "-q", PROPERTY], 120)
    assert code == 4, out + err  # pytest's usage-error exit code
    assert "HYPOTHESIS_PROFILE='dep': not a profile (one of ci, deep)" in out + err
    assert "Traceback" not in out + err
