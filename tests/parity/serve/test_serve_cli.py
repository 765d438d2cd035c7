"""``parity run --tier serve`` end to end on real server processes (the stdlib fake server as
``external:`` targets, and our engine): the ledger acceptance (a divergence is NEW, decided it
is KNOWN, its entry deleted it is NEW again, a bogus entry is STALE), exit codes 2 and 3,
``reports/last-run.json`` and ``--junit``; the external target proven on our own server."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from serve_support import fake_target

from parity.cli import EXIT_BAD_INPUT, EXIT_DIVERGENCE, EXIT_OK, EXIT_TARGET_FAILED, main
from parity.ledger import load_ledger
from parity.results import RunReport
from parity.serve.targets import parse_targets

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parents[3]
FAKE = fake_target()
FAKE_77 = fake_target("--max-model-len", "77")  # /v1/models says 77: one divergence
SCENARIO = """\
id: {name}
description: one request to the fake server
tier: serve
requests:
  - id: r1
    endpoint: completions
    prompt: ok
    max_tokens: 5
{extra}"""


def write(folder: Path, name: str, extra: str = "") -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(SCENARIO.format(name=name, extra=extra), encoding="utf-8")
    return path


def cli(*argv: str) -> int:
    return main(["run", *argv, "--tier", "serve", "--no-progress"])


@pytest.mark.timeout(120)
def test_ledger_acceptance_new_known_deleted_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # reports/last-run.json goes here
    scenario = write(tmp_path, "fake-models")
    ledger = tmp_path / "ledger.yaml"
    ledger.write_text("entries: []\n")
    run = [str(scenario), "--target", FAKE, "--target", FAKE_77, "--ledger", str(ledger)]

    assert cli(*run) == EXIT_DIVERGENCE
    out = capsys.readouterr().out
    ref = "fake-models:other:facts.max_model_len"
    # one line per cause, naming the first ref and its location (-v lists every path)
    assert f"NEW   other (-): 1 in 1 scenario(s) fake-models; first {ref} at {scenario}:1" in out
    last = json.loads((tmp_path / "reports" / "last-run.json").read_text())
    assert last["ledger"]["counts"]["NEW"] == 1
    assert RunReport.from_json(last).results[0].divergences[0].right == 77

    reason = ["--reason", "the fake advertises 77"]
    assert main(["decide", ref, "--diverge", *reason, "--ledger", str(ledger)]) == EXIT_OK
    pair = [t.label for t in parse_targets([FAKE, FAKE_77])]  # how runs name them (#2: twins)
    assert f"for {pair[0]} vs {pair[1]} in" in capsys.readouterr().out  # last-run.json's pair
    assert cli(*run) == EXIT_OK
    assert "ledger: 0 pass, 1 known, 0 new, 0 stale" in capsys.readouterr().out
    report = json.loads((tmp_path / "reports" / "last-run.json").read_text())["ledger"]
    assert report["counts"] == {"PASS": 0, "KNOWN": 1, "NEW": 0, "STALE": 0, "UNSUPPORTED": 0}

    decided = ledger.read_text()
    ledger.write_text("entries: []\n")  # the entry deleted: NEW again
    assert cli(*run, "-v") == EXIT_DIVERGENCE
    assert "NEW   fake-models:other:facts.max_model_len" in capsys.readouterr().out

    ledger.write_text(decided)  # plus a bogus entry for the same scenario and pair: STALE
    bogus = ["fake-models:capacity_overhang:startup", "--diverge", "--reason", "bogus"]
    assert main(["decide", *bogus, "--ledger", str(ledger), "--pair", *pair]) == 0
    capsys.readouterr()
    assert cli(*run) == EXIT_DIVERGENCE
    out = capsys.readouterr().out
    line = load_ledger(ledger).line("fake-models-capacity_overhang")
    assert f"STALE {ledger}:{line}: entry fake-models-capacity_overhang" in out


@pytest.mark.timeout(120)
def test_parity_between_equal_servers_with_junit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    scenario = write(tmp_path, "fake-ok", "expect:\n  status: {r1: 200}\n")
    junit = tmp_path / "out" / "junit.xml"
    argv = [str(scenario), "--target", FAKE, "--target", FAKE, "--junit", str(junit)]
    (tmp_path / "empty.yaml").write_text("entries: []\n")
    assert cli(*argv, "--ledger", str(tmp_path / "empty.yaml")) == EXIT_OK
    assert "PASS" in capsys.readouterr().out
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "1" and suite.get("failures") == "0"


@pytest.mark.timeout(120)
def test_startup_failure_exit_3_unless_expected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    dead = f"external:{sys.executable} -c 'import sys; sys.exit(\"no memory\")' {{port}}"
    refused = write(tmp_path, "both-refuse")
    (tmp_path / "empty.yaml").write_text("entries: []\n")
    ledger = ["--ledger", str(tmp_path / "empty.yaml")]
    assert cli(str(refused), "--target", dead, "--target", dead, *ledger) == EXIT_TARGET_FAILED
    assert "no target started" in capsys.readouterr().out
    expected = write(tmp_path, "refusal-expected", "expect:\n  startup: refused\n")
    assert cli(str(expected), "--target", dead, "--target", dead, *ledger) == EXIT_OK
    one_side = write(tmp_path, "must-start", "expect:\n  startup: started\n")
    assert cli(str(one_side), "--target", FAKE, "--target", dead, *ledger) == EXIT_TARGET_FAILED


@pytest.mark.timeout(60)
def test_malformed_serve_scenario_is_exit_2_without_traceback(tmp_path: Path) -> None:
    from parity_helpers import run_process

    path = write(tmp_path, "broken", "expect:\n  status: {nobody: 200}\n")
    argv = [sys.executable, "-m", "parity.cli", "run", str(path), "--tier", "serve"]
    returncode, out, err = run_process(argv)
    assert returncode == EXIT_BAD_INPUT and "Traceback" not in err and out == ""
    assert err == f"{path}:10: expect.status.nobody: unknown request 'nobody'\n"
    assert main(["run", str(path), "--tier", "serve", "--target", "nope"]) == EXIT_BAD_INPUT


@pytest.mark.timeout(400)
def test_external_target_on_our_own_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    external = f"external:{sys.executable} -m engine serve {{model}} --port {{port}}"
    scenario = ROOT / "scenarios" / "serve" / "stop-strings.yaml"
    argv = [str(scenario), "--target", "engine", "--target", external, "--json", "r.json"]
    assert cli(*argv, "--ledger", str(ROOT / "scenarios" / "ledger.yaml")) == EXIT_OK
    report = RunReport.from_json(json.loads((tmp_path / "r.json").read_text()))
    (result,) = report.results
    assert result.status.value == "pass" and result.targets[1].startswith("external:")
    assert all(o.outcome == "completed" for run in result.runs for o in run.observations)
