"""Pure formatting of repro results: console verdicts, the summary, the Markdown record.

Every function returns a string (the CLI prints or writes it). The Markdown record follows the
port's record (docs/failure-classes.md): a legs table (leg, target, flags, result, time), then the
evidence per leg and target (outcome, bytes and tokens, last progress and verdict times, ``/health``
during the wedge, metrics at the wedge, the scheduler dump's explanation, the stack dump,
SIGTERM, the server log tail) and the divergences between targets with their signatures.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from parity.ledger import Finding
from parity.repro.diverge import LegDivergence
from parity.repro.run import ReproRun
from parity.repro.spec import Leg, Repro
from parity.repro.verdict import RequestVerdict, TargetLeg
from parity.serve.spec import CONFIG_FLAG_KEYS

STALLS = ("zero_byte_hang", "mid_stream_stall", "self_preemption_wedge")
LOG_LINES = 12


def leg_flags(leg: Leg) -> str:
    """The leg's server flags and request limits, as in the port's record."""
    parts: list[str] = []
    for key in CONFIG_FLAG_KEYS:
        if key in leg.config.model_fields_set:
            value = getattr(leg.config, key)
            name = "--" + key.replace("_", "-")
            parts.append(name if value is True else f"{name} {value}")
    parts.extend(leg.config.extra_args)
    sizes = sorted({r.max_tokens for r in leg.requests if r.max_tokens is not None})
    text = " ".join(parts) or "(defaults)"
    if sizes:
        text += ", max_tokens " + "/".join(str(s) for s in sizes)
    copies = sum(r.repeat for r in leg.requests)
    if copies > 1:
        text += f", {copies} requests"
    if any(r.stream for r in leg.requests):
        text += ", stream" if all(r.stream for r in leg.requests) else ", some streamed"
    return text


def result_text(result: TargetLeg) -> str:
    """One line: the class and its key numbers."""
    if result.startup != "started":
        return f"{result.startup}: {result.startup_error or '?'}"
    first = result.requests[0] if result.requests else None
    head = result.klass
    if first is not None and first.outcome != result.klass and len(result.requests) == 1:
        head = f"{first.outcome} ({result.klass})"
    if result.tier == "scheduler":
        tokens = ", ".join(f"{v.request_id} {v.num_tokens} tokens" for v in result.requests)
        return f"{head}: {tokens}" + (f"; {result.wedge}" if result.wedge else "")
    if len(result.requests) == 1 and first is not None:
        text = f"{head}: {_numbers(first)}"
    else:
        counts: dict[str, int] = {}
        for v in result.requests:
            counts[v.klass] = counts.get(v.klass, 0) + 1
        text = f"{head}: " + ", ".join(f"{n} {k}" for k, n in counts.items())
        text += f", {sum(v.num_tokens for v in result.requests)} tokens"
        if result.max_waiting:
            text += f", up to {result.max_waiting:g} waiting"
        preempted = result.metrics_delta.get("num_preemptions")
        if preempted:
            text += f", {preempted:g} preemptions"
    if result.klass in STALLS:
        text += f", /health {_statuses(result)}"
    if result.sigterm is not None:
        text += f"; SIGTERM: {result.sigterm.label}"
    return text


def attempt_text(result: TargetLeg) -> str:
    """The other attempt of a confirmed leg, one line: the first (``flaky``) or the rerun."""
    other = result.other_attempt
    if other is None:
        return ""
    failed = "; ".join(other.expect_failures)
    text = result_text(other) + (f" ({failed})" if failed else "")
    if result.flaky:
        return f"first attempt: {text}; not reproduced on a fresh server"
    return f"reproduced on a fresh server: {text}"


def _numbers(v: RequestVerdict) -> str:
    parts = [f"{v.num_bytes} bytes", f"{v.num_tokens} tokens"]
    if v.status is not None:
        parts.insert(0, f"HTTP {v.status}")
    elif v.outcome in STALLS:
        parts.insert(0, "no status line")
    if v.finish_reason:
        parts.append(f"finish {v.finish_reason}")
    if v.error:
        parts.append(f"error {v.error[:120]!r}")
    if v.reasoning is not None or v.text is not None and v.outcome == "completed":
        content = "null" if v.text is None else f"{len(v.text)} chars"
        parts.append(f"content {content}")
    return ", ".join(parts)


def _statuses(result: TargetLeg) -> str:
    stalled = [v.health_status for v in result.requests if v.outcome in STALLS]
    seen = stalled or list(result.health_statuses)
    text = "/".join("no answer" if s is None else str(s) for s in dict.fromkeys(seen))
    return text + (" (green while wedged)" if stalled and set(stalled) == {200} else "")


def format_verdict(result: TargetLeg) -> str:
    """The console verdict of one (leg, target), printed as soon as it is known."""
    mark = "ok" if not result.expect_failures else "EXPECT FAILED"
    where = result.target
    if result.other_attempt is not None:
        where += " (rerun on a fresh server)"
        mark = "FLAKY" if result.flaky else f"{mark}, reproduced"
    lines = [f"[{result.leg}] {where}: {result_text(result)}  ({result.elapsed_s:.1f} s, {mark})"]
    for failure in result.expect_failures:
        lines.append(f"    expect: {failure}")
    if result.other_attempt is not None:
        lines.append(f"    {attempt_text(result)}")
    if result.startup != "started":
        if result.startup_numbers:
            lines.append(f"    startup numbers: {_kv(result.startup_numbers)}")
        return "\n".join(lines) + "\n"
    for v in result.requests:
        if v.t_verdict_ms is None and result.klass not in STALLS:
            continue
        lines.append("    " + request_evidence(v))
    if result.evidence is not None:
        explanation = result.evidence.explanation
        if explanation:
            lines.append(f"    scheduler: {explanation}")
        elif result.evidence.scheduler_note:
            lines.append(f"    scheduler dump: {result.evidence.scheduler_note}")
        lines.append(f"    stack dump: {result.evidence.stack_note or 'taken (see the record)'}")
    if result.sigterm is not None:
        lines.append(f"    SIGTERM while wedged: {sigterm_text(result)}")
    if result.klass in STALLS or result.klass in ("crashed", "disconnected", "timeout"):
        tail = notable_log_lines(result.log_tail, 4) or _tail(result.log_tail, 4)
        if tail:
            lines.append("    log: " + "\n         ".join(tail))
    return "\n".join(lines) + "\n"


def request_evidence(v: RequestVerdict) -> str:
    """Bytes, tokens, last progress, verdict latency, /health and metrics of one request."""
    text = f"{v.request_id}: {v.outcome}, {v.num_bytes} bytes, {v.num_tokens} tokens"
    if v.t_last_progress_ms is not None:
        text += f", last progress +{v.t_last_progress_ms / 1000:.2f} s"
    if v.t_verdict_ms is not None:
        text += f", verdict +{v.t_verdict_ms / 1000:.2f} s"
    if v.verdict_latency_s is not None:
        text += f" (verdict latency {v.verdict_latency_s:.2f} s)"
    if v.health_status is not None or v.t_verdict_ms is not None:
        text += f"; /health {v.health_status if v.health_status is not None else 'no answer'}"
    if v.metrics:
        text += "; metrics " + metrics_text(v.metrics)
    return text


def metrics_text(m: dict) -> str:
    parts = [f"running {_num(m.get('running'))}", f"waiting {_num(m.get('waiting'))}"]
    reasons = m.get("waiting_by_reason") or {}
    if any(reasons.values()):
        parts[-1] += " (" + ", ".join(f"{k} {_num(v)}" for k, v in reasons.items() if v) + ")"
    usage = m.get("kv_cache_usage_perc")
    parts.append("KV usage " + ("?" if usage is None else f"{usage:.1%}"))
    parts.append(f"preemptions {_num(m.get('num_preemptions'))}")
    parts.append(f"generation tokens {_num(m.get('generation_tokens'))}")
    return ", ".join(parts)


def sigterm_text(result: TargetLeg) -> str:
    term = result.sigterm
    if term is None:
        return "not sent"
    text = f"{term.outstanding} request(s) outstanding; {term.result}"
    if term.health_after:
        text += "; /health after SIGTERM: " + ", ".join(
            f"{s.status or s.error} at +{s.t_ms / 1000:.2f} s" for s in term.health_after
        )
    if term.client_after:
        text += "; client: " + "; ".join(term.client_after)
    return text


def format_findings(findings: Sequence[Finding]) -> list[str]:
    """One line per ledger finding: KNOWN (with the entry and decision) or NEW."""
    lines = []
    for f in findings:
        by = f" [{f.decision} {f.entry_id}]" if f.entry_id else ""
        lines.append(f"{f.verdict.value} {f.ref}{by}")
    return lines


def format_summary(
    run: ReproRun, divergences: Sequence[LegDivergence], findings: Sequence[Finding] = ()
) -> str:
    """The closing lines: the legs table in text, divergences, expectations, timing."""
    lines = [f"repro {run.repro.id}: {len(run.results)} verdicts"]
    for r in run.results:
        lines.append(f"  {r.leg:<10} {r.target:<40} {r.klass}" + (" (FLAKY)" if r.flaky else ""))
    by_leg: dict[str, list[str]] = {}
    for d in divergences:
        names = by_leg.setdefault(d.leg, [])
        if d.signature not in names:
            names.append(d.signature)
    for leg, names in by_leg.items():
        lines.append(f"  divergence in {leg}: {', '.join(names)}")
    capacity = [d for d in divergences if d.signature == "capacity_overhang"]
    for d in capacity[:1]:
        lines.append(f"    {d.divergence.path}: {d.classification.rule}")
    for line in format_findings(findings)[:12]:
        lines.append(f"    ledger: {line}")
    failed = [r for r in run.results if r.expect_failures]
    lines.append(
        f"  expectations: {'all met' if not failed else f'{len(failed)} (leg, target) failed'}"
    )
    for r in run.results:
        if r.flaky:
            lines.append(f"  FLAKY: {r.leg} on {r.target}: {attempt_text(r)}")
    latencies = [r.verdict_latency_s for r in run.results if r.verdict_latency_s is not None]
    if latencies:
        lines.append(f"  verdict latency (last progress -> verdict): max {max(latencies):.2f} s")
    lines.append(
        f"  time: {run.legs_s:.1f} s in legs, {run.elapsed_s:.1f} s in total (server starts included)"
    )
    return "\n".join(lines) + "\n"


def format_markdown(
    run: ReproRun,
    divergences: Sequence[LegDivergence],
    *,
    when: str = "",
    findings: Sequence[Finding] = (),
) -> str:
    """The record ``reports/repro/<id>.md``."""
    repro: Repro = run.repro
    out = [f"# Repro `{repro.id}`", "", repro.description.strip(), ""]
    out.append(f"- file: `{repro.file}`")
    out.append("- targets: " + ", ".join(f"`{t}`" for t in run.targets))
    if when:
        out.append(f"- run: {when}")
    out.append(f"- time: {run.legs_s:.1f} s in legs, {run.elapsed_s:.1f} s in total")
    out += ["", "## Legs", "", "| leg | target | flags | result | time |", "|---|---|---|---|---|"]
    legs = {leg.name: leg for leg in repro.legs}
    for r in run.results:
        flags = leg_flags(legs[r.leg])
        time_text = f"{r.elapsed_s:.1f} s" if r.startup == "started" else "-"
        cells = [r.leg, f"`{r.target}`", f"`{flags}`", _cell(result_text(r)), time_text]
        out.append("| " + " | ".join(cells) + " |")
    failed = [r for r in run.results if r.expect_failures]
    out += ["", f"Expectations: {'all met' if not failed else 'FAILED'}."]
    for r in failed:
        out.append(f"- `{r.leg}` on `{r.target}`: " + "; ".join(r.expect_failures))
    for r in run.results:
        if r.other_attempt is not None:
            flaky = "**FLAKY**: " if r.flaky else ""
            out.append(f"- {flaky}`{r.leg}` on `{r.target}`: {_cell(attempt_text(r))}")
    out += ["", "## Divergences between targets", ""]
    if not divergences:
        out.append("None (each leg compared against the first target).")
    for d in divergences:
        div = d.divergence
        out.append(
            f"- `{d.leg}` `{div.path}` ({div.location}): {_short(div.left)} vs {_short(div.right)}"
            f" -> **{d.signature}** ({d.classification.rule})"
        )
    if findings:
        out += ["", "Decision ledger (`scenarios/ledger.yaml`):", ""]
        out += [f"- {line}" for line in format_findings(findings)]
    out += ["", "## Evidence", ""]
    for r in run.results:
        out += _evidence_md(r, legs[r.leg])
    return "\n".join(out).rstrip() + "\n"


def _evidence_md(r: TargetLeg, leg: Leg) -> list[str]:
    out = [f"### `{r.leg}` ({r.role}) on `{r.target}`", ""]
    out.append(f"- class: **{r.klass}**")
    if r.startup != "started":
        out.append(f"- startup: {r.startup}: `{r.startup_error}`")
        if r.startup_numbers:
            out.append(f"- startup numbers: {_kv(r.startup_numbers)}")
        return [*out, ""]
    if r.startup_s is not None:
        out.append(f"- server started in {r.startup_s:.1f} s; max_model_len {r.max_model_len}")
    for v in r.requests:
        out.append(f"- {request_evidence(v)}")
        out.append(f"  - {v.detail}")
    if r.metrics_delta:
        out.append(f"- over the leg: {_kv(r.metrics_delta)}; max waiting {_num(r.max_waiting)}")
    statuses = ", ".join("no answer" if s is None else str(s) for s in r.health_statuses)
    out.append(f"- /health answers during the leg: {statuses or 'none sampled'}")
    if r.wedge:
        out.append(f"- {r.wedge}")
    if r.evidence is not None:
        ev = r.evidence
        out.append(f"- scheduler dump: {ev.explanation or ev.scheduler_note or 'taken'}")
        if ev.scheduler is not None:
            text = json.dumps(ev.scheduler, indent=1)[:4000]
            out += ["", "```json", text, "```", ""]
        out.append(f"- stack dump: {ev.stack_note or 'taken'}")
        if ev.stack:
            out += ["", "```", ev.stack[:6000], "```", ""]
    if r.sigterm is not None:
        out.append(f"- SIGTERM while wedged: {sigterm_text(r)}")
    notable = notable_log_lines(r.log_tail, LOG_LINES)
    if notable:
        out += ["", "Notable server log lines:", "", "```", *notable, "```"]
    tail = _tail(r.log_tail, LOG_LINES)
    if tail:
        out += ["", "Server log tail:", "", "```", *tail, "```"]
    return [*out, ""]


NOTABLE = ("SIGTERM", "shutdown", "Traceback", "Error", "wedged", "Waiting: ", "preempt")


def notable_log_lines(log: str, n: int) -> list[str]:
    """The last ``n`` log lines that say something about a wedge or a shutdown (access-log
    lines of the harness's own polling are skipped)."""
    lines = [
        line.rstrip()[:240]
        for line in log.splitlines()
        if any(word in line for word in NOTABLE) and '"GET /' not in line
    ]
    return lines[-n:]


def _tail(log: str, n: int) -> list[str]:
    lines = [line.rstrip() for line in log.splitlines() if line.strip()]
    return [line[:240] for line in lines[-n:]]


def _kv(data: dict) -> str:
    return ", ".join(f"{k} {_num(v)}" for k, v in data.items())


def _num(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "?" if value is None else str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _short(value: object) -> str:
    text = json.dumps(value, default=str)
    return f"`{_cell(text[:160])}`"
