"""The ``parity`` command line: exit codes, ``file:line`` errors, tables, JSON, traces, -k."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from parity_helpers import SCENARIOS, run_process

from parity.cli import EXIT_BAD_INPUT, EXIT_DIVERGENCE, EXIT_OK, main
from parity.keyword import KeywordError, matches
from parity.results import RunReport, Status, TargetRun

pytestmark = pytest.mark.timeout(120)

BAD = """\
id: broken
description: d
tier: scheduler
config: {block_size: 16, num_gpu_blocks_override: 4}
requests:
  - id: r1
    prompt_token_ids: [389]
    max_tokens: many
"""


def engine(model_dir: Path) -> list[str]:
    return ["--target", f"engine:{model_dir}", "--no-progress"]


def test_bad_scenario_exits_2_with_file_line(
    write_yaml: Callable[[str, str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_yaml("broken", BAD)
    assert main(["run", str(path), "--target", "engine"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err == f"{path}:8: requests[0].max_tokens: Input should be a valid integer, got 'many'\n"


def test_bad_scenario_in_a_real_process_has_no_traceback(
    write_yaml: Callable[[str, str], Path],
) -> None:
    path = write_yaml("broken", BAD)
    returncode, out, err = run_process([sys.executable, "-m", "parity.cli", "run", str(path)])
    assert returncode == EXIT_BAD_INPUT
    assert "Traceback" not in err and out == ""
    assert err.startswith(f"{path}:8: requests[0].max_tokens:")


def test_run_on_the_engine_passes_and_writes_json(
    scripted_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json = tmp_path / "report.json"
    argv = ["run", str(SCENARIOS), *engine(scripted_model_dir), "--json", str(out_json)]
    assert main(argv) == EXIT_OK
    out = capsys.readouterr().out
    assert "port-wedge-bs16" in out and "wedged at step 47" in out
    report = RunReport.from_json(json.loads(out_json.read_text()))
    assert len(report.results) >= 15
    assert {r.status for r in report.results} == {Status.PASS}
    assert report.to_json() == json.loads(out_json.read_text())


def test_keyword_selection_and_expect_failure_exit_1(
    scripted_model_dir: Path,
    write_yaml: Callable[[str, str], Path],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    out_json = tmp_path / "k.json"
    argv = [
        "run",
        str(SCENARIOS),
        "-k",
        "port and not (control or auto)",
        *engine(scripted_model_dir),
    ]
    assert main([*argv, "--json", str(out_json)]) == EXIT_OK
    ids = [r["scenario_id"] for r in json.loads(out_json.read_text())["results"]]
    assert ids == ["port-wedge-bs16"]
    text = (
        (SCENARIOS / "port-wedge-bs16.yaml").read_text().replace("port-wedge-bs16", "wrong-expect")
    )
    path = write_yaml("wrong-expect", text.replace("wedged_at_step: 47", "wedged_at_step: 40"))
    capsys.readouterr()
    assert main(["run", str(path), *engine(scripted_model_dir)]) == EXIT_DIVERGENCE
    out = capsys.readouterr().out
    assert f"{path}:" in out and "expect.wedged_at_step: expected 40, got 47" in out


def test_unknown_target_and_empty_selection_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(SCENARIOS), "--target", "nope"]) == EXIT_BAD_INPUT
    assert (
        "unknown scheduler-tier target 'nope' (known: engine, oracle, oracle@VERSION, worker:<command>)"
        in capsys.readouterr().err
    )
    assert main(["run", str(SCENARIOS), "--tier", "serve"]) == EXIT_BAD_INPUT
    assert "no serve-tier scenarios selected" in capsys.readouterr().err
    assert main(["run", str(SCENARIOS), "-k", "a and (b"]) == EXIT_BAD_INPUT
    assert capsys.readouterr().err == "-k 'a and (b': unexpected end of expression\n"


def test_scheduler_tier_engine_takes_divergence_profiles(
    scripted_model_dir: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    wedge = str(SCENARIOS / "port-wedge-bs16.yaml")
    profiled = f"engine:{scripted_model_dir} --divergence abort-unservable"
    argv = ["run", wedge, "--target", f"engine:{scripted_model_dir}", "--target", profiled]
    ledger = str(Path(__file__).resolve().parents[2] / "scenarios" / "ledger.yaml")
    # every divergence is KNOWN by the profile's entry; the file's expect block (a wedge at
    # step 47) fails on the profiled engine, which finishes the request with an error instead:
    # explained by the ledger (the reference met it and the pair's findings are all KNOWN)
    json_out = tmp_path / "profiled-run.json"
    assert main([*argv, "--no-progress", "--ledger", ledger, "--json", str(json_out)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "ledger: 0 pass, 7 known, 0 new, 0 stale" in out
    # the summary names the two targets compared, by their labels
    assert re.search(
        r"1 scenario: 1 divergence in [\d.]+ s \(engine vs engine --divergence abort-unservable\)\n",
        out,
    ), out
    (result,) = json.loads(json_out.read_text())["results"]
    failed = [(f["target"], f["path"]) for f in result["expect_failures"]]
    assert failed and all(t.endswith("--divergence abort-unservable") for t, _ in failed), failed
    # with an empty ledger the divergences are NEW and the expect failure fails the run too
    empty = tmp_path / "empty-ledger.yaml"
    empty.write_text("entries: []\n")
    assert main([*argv, "--no-progress", "--ledger", str(empty)]) == EXIT_DIVERGENCE
    assert "expect.outcome.r1: expected 'wedged'" in capsys.readouterr().out
    for flags, message in [
        ("--divergence reasoning-content-field", "acts at the serve tier only"),
        ("--divergence nope", "unknown divergence profile 'nope'"),
        ("--port 3", "unknown flag '--port' (only --divergence NAME)"),
    ]:
        assert main(["run", wedge, "--target", f"engine {flags}"]) == EXIT_BAD_INPUT
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert main(["run", wedge, "--target", "oracle --divergence abort-unservable"]) == 2
    assert "target 'oracle' takes no flags" in capsys.readouterr().err


def test_trace_prints_the_full_trace(
    scripted_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = SCENARIOS / "s09-self-preemption-recovery.yaml"
    argv = ["trace", str(scenario), "--target", f"engine:{scripted_model_dir}"]
    assert main([*argv, "--json"]) == EXIT_OK
    run = TargetRun.from_json(json.loads(capsys.readouterr().out))
    assert len(run.steps) == 25 and run.steps[7].preempted_req_ids == ("B",)
    assert run.summary.outcomes["B"].finished_at_step == 25
    assert main(argv) == EXIT_OK
    table = capsys.readouterr().out
    assert "engine: finished in 25 steps" in table and "A:10 B:10" in table


def test_keyword_expressions() -> None:
    names = ("port-wedge-control-bs32", "scheduler")
    assert matches("port", names) and matches("PORT and control", names)
    assert not matches("port and not control", names)
    assert matches("(s09 or bs32) and not s10", names)
    assert matches("", names)
    for bad in ("a and", "(a", "and a", "a b"):
        with pytest.raises(KeywordError):
            matches(bad, names)
