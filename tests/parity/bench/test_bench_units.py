"""The benchmark's pure parts: statistics, load metrics, targets, report files, scenarios."""

from __future__ import annotations

import json
import math
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from parity.bench.differential import random_scenario
from parity.bench.loads import Load, load_metrics, load_request, tree_cpu_s, tree_rss
from parity.bench.report import SCHEMA_KEYS, charts, markdown, update_latest, write_run
from parity.bench.serve import rep_order
from parity.bench.stats import median, percentile, ratio
from parity.bench.suite import default_suite, repeat_suite, timed_command
from parity.bench.targets import evaluate

pytestmark = pytest.mark.timeout(60)


def test_percentile_interpolates_like_numpy() -> None:
    values = [10.0, 20.0, 30.0, 40.0]
    assert percentile(values, 50) == 25.0
    assert percentile(values, 0) == 10.0 and percentile(values, 100) == 40.0
    assert math.isclose(percentile(values, 99) or 0.0, 39.7)
    assert percentile([], 50) is None and percentile([7.0], 99) == 7.0
    assert median([3.0, None, 1.0, 2.0]) == 2.0 and median([None]) is None
    assert ratio(1.0, 0.0) is None and ratio(None, 1.0) is None and ratio(3.0, 2.0) == 1.5


def test_load_request_is_a_fixed_length_greedy_stream() -> None:
    body = load_request(Load("8x128", "mid", 8, 128)).request_body("scripted")
    assert body["max_tokens"] == 128 and body["ignore_eos"] is True
    assert body["temperature"] == 0.0 and body["stream"] is True
    spec = load_request(Load("8x128", "mid", 8, 128))
    assert (spec.repeat, spec.concurrency) == (8, 8)


def test_load_metrics_from_frames(make_observation, make_run) -> None:
    load = Load("2x4", "mid", 2, 4)
    # stream a: 4 frames of one token; stream b: sent 10 ms later, one frame carries 2 tokens
    a = make_observation("x#0", [(20.0, 1), (30.0, 1), (40.0, 1), (50.0, 1)])
    b = make_observation("x#1", [(30.0, 1), (50.0, 2), (60.0, 1)], t_send_ms=10.0)
    metrics = load_metrics(load, make_run([a, b]), peak_rss=512 * 1024 * 1024, server_cpu_s=0.8)
    assert metrics.completed == 2 and metrics.output_tokens == 8 and metrics.problems == ()
    assert metrics.ttft_p50_ms == 25.0  # 20 and 30
    # ITL per token-carrying frame: a 10,10,10; b 20,10
    assert metrics.itl_p50_ms == 10.0 and metrics.itl_p99_ms == pytest.approx(19.6)
    # wall time: first send 0 -> last byte of b at 10 + 60.5 ms
    assert metrics.duration_s == pytest.approx(0.0705)
    assert metrics.output_tok_s == pytest.approx(8 / 0.0705, rel=1e-3)
    assert metrics.peak_rss_mib == 512.0
    assert metrics.server_cpu_s == 0.8 and metrics.cpu_ms_per_token == 100.0


def test_short_or_unfinished_streams_are_problems(make_observation, make_run) -> None:
    load = Load("2x3", "mid", 2, 3)
    short = make_observation("x#0", [(20.0, 1), (30.0, 1)])
    stalled = make_observation("x#1", [(20.0, 3)], outcome="mid_stream_stall", done=False)
    metrics = load_metrics(load, make_run([short, stalled]), peak_rss=None)
    assert metrics.completed == 0 and len(metrics.problems) == 2
    assert metrics.output_tok_s is None and metrics.ttft_p50_ms is None
    assert "mid_stream_stall" in metrics.problems[1]


def test_sides_alternate_which_goes_first() -> None:
    assert rep_order(0) == ("engine", "oracle") and rep_order(1) == ("oracle", "engine")


def test_tree_rss_and_cpu_count_this_process() -> None:
    assert tree_rss(os.getpid()) > 10 * 1024 * 1024
    assert tree_rss(2**22 + 12345) == 0 and tree_cpu_s(2**22 + 12345) == 0.0  # no such process
    assert tree_cpu_s(os.getpid()) > 0.0


def test_targets_pass_and_fail_per_line(make_results) -> None:
    lines = {t.id: t for t in evaluate(make_results())}
    assert lines["startup"].passed is True and lines["startup"].measured == pytest.approx(10.0)
    assert lines["single_stream"].passed is True  # 200 / 190
    assert lines["concurrent"].passed is True and lines["concurrent_stretch"].passed is False
    assert lines["mid_concurrency"].passed is False  # 700 / 720: every ratio must be >= 1.0x
    assert "8x128" in lines["mid_concurrency"].goal
    assert lines["scheduler_step"].measured == 0.8 and lines["scheduler_step"].passed is True
    assert lines["differential"].passed is True and lines["wedge_verdict"].passed is True
    assert lines["default_suite"].passed is None and lines["default_suite"].shown == "not measured"
    assert lines["fresh_clone"].passed is None
    slow = {t.id: t for t in evaluate(make_results(engine_startup=10.0, sched_ratios=(1.2,),
                                                   examples_per_s=12.0, wedge_s=6.0,
                                                   suite_s=900.0, clone_s=121.0))}  # fmt: skip
    assert not any(slow[k].passed for k in ("startup", "scheduler_step", "differential"))
    assert slow["wedge_verdict"].passed is False and slow["default_suite"].passed is False
    assert slow["fresh_clone"].passed is False and "load 1.0->2.0" in slow["default_suite"].note
    assert lines["repeat_suite"].passed is None
    fast = {t.id: t for t in evaluate(make_results(suite_s=70.0, clone_s=110.0, repeat_s=40.0))}
    assert fast["default_suite"].passed is True and fast["fresh_clone"].passed is True
    assert fast["repeat_suite"].passed is True and "load 0.5->0.7" in fast["repeat_suite"].note
    assert evaluate(make_results(repeat_s=80.0))[-2].passed is False
    one_tier = make_results(suite_s=70.0)
    one_tier["harness"]["default_suite"]["tier"] = "scheduler"  # quick mode: no servers
    assert {t.id: t for t in evaluate(one_tier)}["default_suite"].passed is None


def test_missing_phases_are_not_measured(make_results) -> None:
    results = make_results(examples_per_s=None, wedge_s=None)
    del results["serve"]
    lines = {t.id: t for t in evaluate(results)}
    for key in (
        "startup",
        "single_stream",
        "mid_concurrency",
        "concurrent",
        "differential",
        "wedge_verdict",
    ):
        assert lines[key].passed is None and lines[key].measured is None


def test_report_files(tmp_path: Path, make_results) -> None:
    results = make_results()
    results["targets"] = [t.to_json() for t in evaluate(results)]
    run_dir = tmp_path / "bench" / results["run_id"]
    write_run(run_dir, results)
    data = json.loads((run_dir / "results.json").read_text())
    assert set(SCHEMA_KEYS) <= set(data) and data["charts"] == sorted(charts(results))
    text = (run_dir / "results.md").read_text()
    assert "| target | measured | result | note |" in text
    assert "| output tok/s | 1,000 | 1,900 | 0.53x |" in text
    assert "FAIL" in text and "PASS" in text and "load average" in text.lower()
    for name in data["charts"]:
        root = ET.parse(run_dir / name).getroot()
        assert root.tag.endswith("svg") and root.findall(".//{http://www.w3.org/2000/svg}rect")
    assert markdown(results).startswith("# Benchmark 2026-01-01_000000")


def test_latest_points_at_the_newest_run(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    for run_dir in (first, second):
        run_dir.mkdir()
        (run_dir / "results.json").write_text(run_dir.name)
    update_latest(tmp_path, first)
    assert (tmp_path / "latest" / "results.json").read_text() == "a"
    update_latest(tmp_path, second)
    assert (tmp_path / "latest" / "results.json").read_text() == "b"
    assert os.readlink(tmp_path / "latest") == "b"  # relative: the folder can move


def test_random_scenarios_are_seeded_and_valid() -> None:
    assert random_scenario(7) == random_scenario(7)
    scenarios = [random_scenario(seed) for seed in range(50)]
    assert len({s.model_dump_json() for s in scenarios}) == 50
    for scenario in scenarios:
        assert scenario.runs_at_scheduler_tier and 1 <= len(scenario.requests) <= 8
        assert all(r.max_tokens is not None for r in scenario.requests)


def test_a_timed_command_is_measured_and_a_slow_one_reaped(tmp_path: Path) -> None:
    done = timed_command(["sh", "-c", "echo hi; exit 1"], cwd=tmp_path, log=tmp_path / "a.log",
                         timeout_s=30.0)  # fmt: skip
    assert done["returncode"] == 1 and "error" not in done  # exit 1 is a verdict, not a failure
    assert (tmp_path / "a.log").read_text() == "hi\n" and len(done["loadavg_before"]) == 3
    stuck = timed_command(["sh", "-c", "sleep 60 & sleep 60"], cwd=tmp_path,
                          log=tmp_path / "b.log", timeout_s=0.5)  # fmt: skip
    assert "not finished within" in stuck["error"] and stuck["elapsed_s"] < 20


def test_the_suite_is_one_run_of_both_tiers_and_a_failure_is_no_time(tmp_path: Path,
                                                                     monkeypatch) -> None:  # fmt: skip
    import parity.bench.suite as suite

    calls: list[list[str]] = []

    def fake(argv, **kw):
        calls.append(argv)
        return {"elapsed_s": 1.0, "returncode": 2, "error": "exit code 2",
                "loadavg_before": [0, 0, 0], "loadavg_after": [0, 0, 0]}  # fmt: skip

    monkeypatch.setattr(suite, "timed_command", fake)
    found = default_suite(tmp_path)
    assert len(calls) == 1 and calls[0][calls[0].index("--tier") + 1] == "both"  # as make parity
    assert found["elapsed_s"] is None and "--tier both" in found["error"]


@pytest.mark.timeout(120)
def test_the_repeat_suite_runs_twice_beside_one_broker(tmp_path: Path, monkeypatch) -> None:
    import parity.bench.suite as suite
    from parity.serve.lease import ENV

    seen: list[tuple[str, str, bool]] = []

    def fake(argv, *, cwd, log, timeout_s, env):
        seen.append((argv[argv.index("--tier") + 1], env[ENV], Path(env[ENV]).exists()))
        return {"elapsed_s": 4.0 if len(seen) == 1 else 2.0, "returncode": 0, "log": str(log),
                "loadavg_before": [0, 0, 0], "loadavg_after": [0, 0, 0]}  # fmt: skip

    monkeypatch.setattr(suite, "timed_command", fake)
    found = repeat_suite(tmp_path)
    assert [tier for tier, _, _ in seen] == ["both", "both"]
    socket_path = seen[0][1]
    assert all(path == socket_path and listening for _, path, listening in seen)
    assert found["elapsed_s"] == 2.0 and found["first"]["elapsed_s"] == 4.0  # the second run
    assert not Path(socket_path).exists()  # the broker was stopped and took its socket along
