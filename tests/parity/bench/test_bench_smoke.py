"""``python -m parity.bench --quick`` end to end into a temporary folder (real servers).

Checks the run's layout and schema, that every load completed on both sides with measured
numbers, and that the Markdown tables are there. It never checks whether a speed target passed:
that depends on the machine and its load.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from parity.bench.report import SCHEMA, SCHEMA_KEYS
from parity.bench.targets import evaluate
from parity.serve.spec import ROOT

pytestmark = [pytest.mark.server, pytest.mark.oracle]

RUN_TIMEOUT_S = 280.0


def _run_quick(out: Path, model: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "parity.bench", "--quick", "--no-progress",
            "--out", str(out), "--model", str(model)]  # fmt: skip
    proc = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        process_group=0,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            stdout, stderr = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate(timeout=15)
        pytest.fail(f"parity.bench --quick ran over {RUN_TIMEOUT_S} s\n{stderr[-3000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # anything of the group left behind
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


@pytest.mark.timeout(320)
def test_quick_bench_end_to_end(tmp_path: Path, scripted_model_dir: Path) -> None:
    done = _run_quick(tmp_path, scripted_model_dir)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-4000:]}"
    runs = [p for p in tmp_path.iterdir() if p.is_dir() and not p.is_symlink()]
    assert len(runs) == 1 and (tmp_path / "latest").resolve() == runs[0].resolve()
    run_dir = runs[0]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["schema"] == SCHEMA and set(SCHEMA_KEYS) <= set(results)
    assert results["quick"] is True and results["errors"] == []
    assert len(results["machine"]["loadavg"]["start"]) == 3
    assert len(results["machine"]["loadavg"]["end"]) == 3

    serve = results["serve"]
    assert serve["order"] == ["engine#1", "oracle#1"]
    for side in ("engine", "oracle"):
        assert serve["startup"][side]["median_s"] > 0
    assert [load["role"] for load in serve["loads"]] == ["single", "mid", "high"]
    for load in serve["loads"]:
        for side in ("engine", "oracle"):
            metrics = load[side]
            assert metrics["completed"] == [load["streams"]], metrics["problems"]
            assert metrics["output_tok_s"] > 0 and metrics["ttft_p50_ms"] > 0
            assert metrics["itl_p50_ms"] > 0 and metrics["peak_rss_mib"] > 100
        assert load["ratio"]["output_tok_s"] > 0

    scheduler = results["scheduler"]
    assert [w["kv"] for w in scheduler["workloads"]] == ["ample", "tight"]
    assert all(w["traces_agree"] for w in scheduler["workloads"])
    assert scheduler["differential"]["examples_per_s"] > 0

    wedge = results["harness"]["wedge"]
    if "verdict_latency_s" in wedge:  # the engine's legacy-capacity mode wedges
        assert wedge["stall_s"] <= wedge["verdict_latency_s"] <= wedge["stall_s"] + 3.0
    suite = results["harness"]["default_suite"]
    assert suite["tier"] == "scheduler" and suite["returncode"] == 0 and suite["elapsed_s"] > 0
    assert "Default suite, `parity run --tier scheduler`:" in (run_dir / "results.md").read_text()
    assert results["harness"]["fresh_clone"]["elapsed_s"] is None  # quick mode: not measured
    assert [t["id"] for t in results["targets"]] == [t.id for t in evaluate(results)]

    text = (run_dir / "results.md").read_text()
    assert "| target | measured | result | note |" in text
    assert "| metric | engine | oracle | engine/oracle |" in text
    assert "| workload | steps | engine ms/step |" in text
    for target in results["targets"]:
        assert target["goal"] in text
    for chart in results["charts"]:
        assert (run_dir / chart).read_text().startswith("<svg")
    assert {"startup.svg", "throughput.svg", "scheduler.svg"} <= set(results["charts"])
    assert "wrote" in done.stdout and "load average" in done.stdout
