"""Acceptance: every scheduler-tier scenario shows parity with the pinned upstream scheduler,
and every ``expect:`` block holds on both targets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from parity_helpers import SCENARIOS

from parity.cli import EXIT_OK, main
from parity.format import format_details
from parity.loader import load_scenarios
from parity.results import Status
from parity.runner import run_scenario

pytestmark = [pytest.mark.oracle, pytest.mark.timeout(600)]


def test_every_scenario_is_parity_and_meets_expect(engine_target: Any, oracle_target: Any) -> None:
    results = []
    for scenario in load_scenarios([SCENARIOS]):
        result, _runs = run_scenario(scenario, [engine_target, oracle_target])
        results.append(result)
    failing = [r for r in results if r.status is not Status.PASS]
    assert not failing, format_details(failing)
    wedge = next(r for r in results if r.scenario_id == "port-wedge-bs16")
    assert wedge.verdict.startswith("parity: both wedged at step 47: no progress for 50 steps")
    oracle_notes = wedge.runs[1].notes
    assert oracle_notes and "would refuse this config at startup" in oracle_notes[0]


def test_parity_run_cli_exits_0(
    scripted_model_dir: Path, oracle_target: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", str(SCENARIOS), "--tier", "scheduler", "--no-progress"]
    argv += ["--target", f"engine:{scripted_model_dir}", "--target", f"oracle:{scripted_model_dir}"]
    assert main(argv) == EXIT_OK
    out = capsys.readouterr().out
    assert "parity: both wedged at step 47" in out and "divergence" not in out
    assert "note: port-wedge-bs16: oracle" in out and "would refuse this config at startup" in out
