"""A port's own server as a project-file target, end to end against a fake OpenAI server:
its flag names, no vLLM-only field it did not ask for, UNSUPPORTED instead of divergences,
token ids derived from the text, and the grouped summary. No vLLM, no model forward: the fake
server (``fake_server.py --strict``) is an OpenAI-only server like the ones nobody here wrote.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from serve_support import FAKE_SERVER

from parity.cli import EXIT_OK, main
from parity.ledger import Verdict, classify, load_ledger
from parity.loader import load_scenarios
from parity.project import load_project
from parity.results import Status
from parity.serve.pool import ServerHandle, ServerPool
from parity.serve.suite import ServePlan, run_serve_scenarios
from parity.serve.targets import parse_target

pytestmark = pytest.mark.server

PROJECT = f"""\
[parity]
scenarios = ["scenarios"]
ledger = "ledger.yaml"

[targets.strict]
command = ["{sys.executable}", "{FAKE_SERVER}", "--port", "{{port}}", "--strict"]
startup_timeout_s = 60
[targets.strict.flags]
block_size = ["--bs", "{{value}}"]
max_model_len = false

[targets.quiet]
command = ["{sys.executable}", "{FAKE_SERVER}", "--port", "{{port}}", "--strict"]
health = "/v1/models"
startup_timeout_s = 60
[targets.quiet.flags]
block_size = ["--bs", "{{value}}"]
[targets.quiet.capabilities]
metrics = false

[targets.lenient]
command = ["{sys.executable}", "{FAKE_SERVER}", "--port", "{{port}}"]
vllm_flags = true
"""
SCENARIOS = {
    "plain": """\
id: plain
description: a completion both answer
tier: serve
config: {block_size: 32}
requests:
  - {id: r1, endpoint: completions, prompt: ok, max_tokens: 5}
limits: {stall_s: 5}
""",
    "extension": """\
id: extension
description: a vLLM request extension the strict server refuses
tier: serve
config: {block_size: 32}
requests:
  - {id: r1, endpoint: completions, prompt: ok, max_tokens: 5, ignore_eos: true}
limits: {stall_s: 5}
""",
    "no-len": """\
id: no-len
description: a config key the strict server cannot take
tier: serve
config: {block_size: 32, max_model_len: 96}
requests:
  - {id: r1, endpoint: completions, prompt: ok, max_tokens: 5}
limits: {stall_s: 5}
""",
}


@pytest.fixture
def port_project(tmp_path: Path) -> Path:
    (tmp_path / "parity.toml").write_text(PROJECT, encoding="utf-8")
    (tmp_path / "ledger.yaml").write_text("entries: []\n", encoding="utf-8")
    folder = tmp_path / "scenarios"
    folder.mkdir()
    for name, text in SCENARIOS.items():
        (folder / f"{name}.yaml").write_text(text, encoding="utf-8")
    return tmp_path


def _started(pool: ServerPool, project: Any, scenarios: dict[str, Any], name: str) -> ServerHandle:
    """Target ``name`` of the project, started (asserted) with the ``plain`` scenario's config."""
    plan = ServePlan.of(scenarios["plain"], project)
    handle = pool.get(parse_target(name, project), plan.config)
    assert handle.startup.started, handle.startup.describe()
    return handle


def test_a_port_target_gets_its_flags_and_no_field_it_did_not_ask_for(
    port_project: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    project = load_project(port_project / "parity.toml")
    scenarios = {s.id: s for s in load_scenarios([port_project / "scenarios"])}
    with ServerPool(tmp_path_factory.mktemp("logs")) as pool:
        handle = _started(pool, project, scenarios, "strict")
        argv = httpx.get(f"{handle.url}/argv", timeout=10).json()
        assert argv[-2:] == ["--bs", "32"]  # its own spelling; no vLLM flag at all
        assert not any(word.startswith("--served-model-name") for word in argv)
        # probed once: no /metrics, and it refuses every vLLM request extension
        assert handle.capabilities["metrics"] is False
        assert handle.capabilities["return_token_ids"] is False
        assert handle.capabilities["ignore_eos"] is False
        results = run_serve_scenarios(
            list(scenarios.values()), ["lenient", "strict"], pool=pool, project=project
        )
        # no-len's config is one only lenient can take: nothing to compare, so no server for it
        started = [h.config.engine_args for h in pool.handles if h.label == "lenient"]
        assert started == [{"block_size": 32}], started
    by_id = {r.scenario_id: r for r in results}
    plain = by_id["plain"]
    assert plain.status is Status.PASS, [d.describe() for d in plain.divergences]
    lenient_run, strict_run = plain.runs
    strict_obs = strict_run.observations[0]
    assert "return_token_ids" not in strict_obs.request_body  # not sent to a server without it
    assert lenient_run.observations[0].request_body["return_token_ids"] is True
    assert strict_obs.outcome == "completed" and strict_obs.result.token_ids_derived
    assert strict_obs.result.token_ids == strict_obs.result.text_token_ids is not None
    assert by_id["extension"].status is Status.UNSUPPORTED
    assert "ignore_eos" in (by_id["extension"].runs[1].unsupported or "")
    assert by_id["no-len"].status is Status.UNSUPPORTED
    assert "max_model_len" in (by_id["no-len"].runs[1].unsupported or "")
    assert by_id["no-len"].runs[0].unsupported == by_id["no-len"].runs[1].unsupported
    assert by_id["no-len"].verdict == f"unsupported: {by_id['no-len'].runs[1].unsupported}"
    report = classify(results, load_ledger(port_project / "ledger.yaml"), scenarios)
    verdicts = {(f.scenario_id, f.verdict) for f in report.findings}
    assert verdicts == {
        ("plain", Verdict.PASS),
        ("extension", Verdict.UNSUPPORTED),
        ("no-len", Verdict.UNSUPPORTED),
    }
    assert report.exit_code == 0


def test_the_monitor_polls_the_declared_readiness_path_and_no_metrics_it_lacks(
    port_project: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    project = load_project(port_project / "parity.toml")
    scenarios = {s.id: s for s in load_scenarios([port_project / "scenarios"])}
    with ServerPool(tmp_path_factory.mktemp("logs")) as pool:
        handle = _started(pool, project, scenarios, "quiet")
        results = run_serve_scenarios(
            [scenarios["plain"]], ["lenient", "quiet"], pool=pool, project=project
        )
        assert handle.log_path is not None
        log = handle.log_path.read_text(encoding="utf-8")
    paths = [line.split()[-1] for line in log.splitlines() if line.startswith("request GET ")]
    assert "/health" not in paths and "/metrics" not in paths, paths
    assert paths.count("/v1/models") >= 3  # the startup wait and the monitor's samples
    run = results[0].runs[1]
    assert run.health and {h.status for h in run.health} == {200}
    assert results[0].status is Status.PASS, [d.describe() for d in results[0].divergences]


def test_the_cli_run_from_the_port_folder_reads_as_a_short_list(
    port_project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(port_project)
    code = main(["run", "--target", "lenient", "--target", "strict", "--no-progress"])
    out = capsys.readouterr().out
    assert code == EXIT_OK, out
    unsupported = [line for line in out.splitlines() if line.startswith("UNSUPPORTED")]
    assert len(unsupported) == 2, out  # one line per reason, not one per divergence
    assert "(lenient vs strict)" in unsupported[0]
    assert "0 new, 0 stale, 2 unsupported" in out
    assert (port_project / "reports" / "last-run.json").is_file()
