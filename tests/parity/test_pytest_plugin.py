"""The pytest plugin in a real pytest process: scenario files collected as items, a divergence
shown with its ``file:line`` and ledger hint, a malformed file failing with ``file:line``,
scheduler-tier items run in-process, serve-tier items on servers (the fake server as
``external:`` targets), and ``-n 2`` (pytest-xdist) without port clashes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from parity_helpers import ROOT, SCENARIOS, run_process

pytestmark = [pytest.mark.timeout(300), pytest.mark.server]

FAKE = f"external:{sys.executable} {ROOT}/tests/parity/serve/fake_server.py --port {{port}}"
SERVE = """\
id: {name}
description: one request to the fake server
tier: serve
requests:
  - id: r1
    endpoint: completions
    prompt: ok
    max_tokens: 5
"""


def scenario_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "scenarios"
    folder.mkdir()
    for name in ("serve-a", "serve-b"):
        (folder / f"{name}.yaml").write_text(SERVE.format(name=name))
    (folder / "wrong.yaml").write_text(SERVE.format(name="wrong").replace("max_tokens: 5", "x: 1"))
    (folder / "ledger.yaml").write_text("entries: []\n")
    return folder


def _registered_by_entry_point() -> bool:
    from importlib.metadata import entry_points

    return any(ep.value == "parity.pytest_plugin" for ep in entry_points(group="pytest11"))


def pytest_argv(folder: Path, *targets: str, extra: tuple[str, ...] = ()) -> list[str]:
    argv = [sys.executable, "-m", "pytest", str(folder)]
    if not _registered_by_entry_point():  # a pytest11 entry point loads it by itself
        argv += ["-p", "parity.pytest_plugin"]
    argv += ["-p", "no:cacheprovider", "--rootdir", str(folder.parent), "-c", "/dev/null"]
    argv += ["--parity-ledger", str(folder / "ledger.yaml"), *extra]
    for target in targets:
        argv += ["--parity-target", target]
    return argv


def test_collects_runs_and_reports_file_line(tmp_path: Path) -> None:
    folder = scenario_dir(tmp_path)
    other = FAKE + " --max-model-len 77"
    code, out, err = run_process(pytest_argv(folder, FAKE, other, extra=("-q",)), timeout=240)
    assert code == 1, out + err
    assert "3 failed" in out  # both serve scenarios diverge; the malformed file fails
    assert f"{folder}/wrong.yaml:8: requests[0].x: unknown key" in out
    assert "serve-a.yaml:1: facts.max_model_len" in out and "NEW   serve-a:other:" in out
    assert "parity decide" in out and "Traceback" not in out
    code, out, err = run_process(pytest_argv(folder, FAKE, FAKE, extra=("-q",)), timeout=240)
    assert code == 1 and "1 failed, 2 passed" in out, out + err


def test_xdist_two_workers(tmp_path: Path) -> None:
    folder = scenario_dir(tmp_path)
    (folder / "wrong.yaml").unlink()
    for index in range(4):
        (folder / f"more-{index}.yaml").write_text(SERVE.format(name=f"more-{index}"))
    argv = pytest_argv(folder, FAKE, FAKE, extra=("-q", "-n", "2", "--dist", "loadgroup"))
    code, out, err = run_process(argv, timeout=240)
    assert code == 0 and "6 passed" in out, out + err


def test_scheduler_items_run_in_process(tmp_path: Path) -> None:
    scenario = SCENARIOS / "s09-self-preemption-recovery.yaml"
    folder = tmp_path / "scenarios"
    folder.mkdir()
    (folder / scenario.name).write_text(scenario.read_text())
    (folder / "ledger.yaml").write_text("entries: []\n")
    code, out, err = run_process(pytest_argv(folder, "engine", "engine", extra=("-v",)), 240)
    assert code == 0 and "s09-self-preemption-recovery PASSED" in out, out + err
