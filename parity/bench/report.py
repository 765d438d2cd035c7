"""Write a benchmark run: ``results.json``, ``results.md`` and SVG charts, and point ``latest``.

Layout of ``reports/bench/<run-id>/``:

- ``results.json``: ``{"schema": "parity-bench/1", "run_id", "started_at", "finished_at",
  "elapsed_s", "quick", "machine": {..., "loadavg": {"start", "end", "phases"}}, "versions",
  "config", "serve", "scheduler", "harness", "targets": [...], "errors": [...]}`` (see
  ``SCHEMA_KEYS``; per-phase shapes in ``parity.bench.serve`` / ``scheduler`` / ``harness``).
- ``results.md``: the targets table (pass / fail / not measured per line) and one table per tier.
- ``startup.svg``, ``throughput.svg``, ``ttft.svg``, ``itl.svg``, ``rss.svg``, ``scheduler.svg``.
- ``logs/``: every server's log.

``reports/bench/latest`` is a relative symlink to the newest run (a copy where links fail).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from parity.bench.svg import grouped_bars

SCHEMA = "parity-bench/1"
SCHEMA_KEYS = (
    "schema", "run_id", "started_at", "finished_at", "elapsed_s", "quick", "machine",
    "versions", "config", "serve", "scheduler", "harness", "targets", "errors",
)  # fmt: skip
SIDES = ("engine", "oracle")
VERDICT = {True: "PASS", False: "FAIL", None: "not measured"}
LOAD_ROWS = (
    ("output_tok_s", "output tok/s", "{:,.0f}"),
    ("ttft_p50_ms", "TTFT p50 (ms)", "{:.1f}"),
    ("ttft_p99_ms", "TTFT p99 (ms)", "{:.1f}"),
    ("itl_p50_ms", "ITL p50 (ms)", "{:.2f}"),
    ("itl_p99_ms", "ITL p99 (ms)", "{:.2f}"),
    ("tpot_mean_ms", "TPOT mean (ms)", "{:.2f}"),
    ("e2e_p50_ms", "E2E p50 (ms)", "{:,.0f}"),
    ("e2e_p99_ms", "E2E p99 (ms)", "{:,.0f}"),
    ("peak_rss_mib", "peak RSS, process tree (MiB)", "{:,.0f}"),
    ("server_cpu_s", "server CPU during the load (s)", "{:.2f}"),
    ("cpu_ms_per_token", "server CPU per output token (ms)", "{:.2f}"),
)


def _num(value: Any, fmt: str = "{:.2f}") -> str:
    return "n/a" if value is None else fmt.format(value)


def _ratio(value: Any) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines + [""]


def _machine_lines(results: dict[str, Any]) -> list[str]:
    machine = results["machine"]
    load = machine.get("loadavg", {})
    fmt = lambda v: "n/a" if not v else " / ".join(f"{x:.2f}" for x in v)  # noqa: E731
    return [
        f"- Machine: {machine.get('hostname')} ({machine.get('cpu_count')} CPUs, "
        f"{machine.get('memory_gib')} GiB, Python {machine.get('python')}, "
        f"{machine.get('platform')})",
        f"- Load average (1/5/15 min): start {fmt(load.get('start'))}, end {fmt(load.get('end'))}"
        " -- the machine is shared; numbers taken under load are noisy and both sides share it"
        " (runs interleave engine and oracle).",
        "- Load average (1 min) as each phase began: "
        + (
            ", ".join(f"{p['phase']} {p['loadavg'][0]:.2f}" for p in load.get("phases", []))
            or "n/a"
        ),  # fmt: skip
        *_speed_lines(machine.get("speed") or {}),
        f"- Pin: {results['versions'].get('oracle')}; elapsed {results['elapsed_s']:.0f} s"
        + (" (quick mode: 1 repetition, small loads)" if results.get("quick") else ""),
        "",
    ]


def _speed_lines(speed: dict[str, Any]) -> list[str]:
    """The machine's speed at the start and the end (``parity.machine.machine_speed``): what
    makes this run's seconds comparable with another day's."""
    from parity.machine import MachineSpeed

    found = [(w, speed[w]) for w in ("start", "end") if speed.get(w)]
    if not found:
        return []
    text = "; ".join(f"{w}: {MachineSpeed.from_json(s).describe()}" for w, s in found)
    return [f"- Machine speed ({text})"]


def _serve_lines(serve: dict[str, Any]) -> list[str]:
    lines = [f"## Serve tier (medians of {serve['repetitions']} repetitions, fresh servers)", ""]
    startup = serve["startup"]
    rows = [[side, _num(startup[side]["median_s"]),
             ", ".join(f"{s:.2f}" for s in startup[side]["samples_s"]),
             _num(serve["idle_rss_mib"].get(side), "{:,.0f}"),
             _num(serve["shutdown_s"].get(side))] for side in SIDES]  # fmt: skip
    lines += _table(["side", "startup to /health (s)", "samples (s)", "idle RSS (MiB)",
                     "SIGTERM to exit (s)"], rows)  # fmt: skip
    lines += [f"Startup speed-up (oracle / engine): {_ratio(startup.get('speedup'))}", ""]
    for load in serve["loads"]:
        lines += [f"### {load['name']}: {load['streams']} x {load['max_tokens']} tokens", ""]
        rows = []
        for key, label, fmt in LOAD_ROWS:
            rows.append([label, _num(load["engine"][key], fmt), _num(load["oracle"][key], fmt),
                         _ratio(load["ratio"][key])])  # fmt: skip
        rows.append(["completed streams per rep", *(str(load[s]["completed"]) for s in SIDES),
                     ""])  # fmt: skip
        lines += _table(["metric", "engine", "oracle", "engine/oracle"], rows)
        problems = load["engine"]["problems"] + load["oracle"]["problems"]
        if problems:
            lines += [f"- problem: {p}" for p in problems] + [""]
    if serve.get("errors"):
        lines += [f"- error: {e}" for e in serve["errors"]] + [""]
    return lines


def _scheduler_lines(scheduler: dict[str, Any]) -> list[str]:
    lines = [f"## Scheduler tier (CPU ms per step, medians of {scheduler['repetitions']})", ""]
    rows = [[w["workload"], str(w["steps"].get("engine")),
             _num(w["engine"]["ms_per_step_median"], "{:.3f}"),
             _num(w["oracle"]["ms_per_step_median"], "{:.3f}"), _ratio(w["ratio"]),
             "yes" if w["traces_agree"] else "NO"] for w in scheduler.get("workloads", [])]  # fmt: skip
    lines += _table(["workload", "steps", "engine ms/step", "upstream ms/step",
                     "engine/upstream", "traces agree"], rows)  # fmt: skip
    diff = scheduler.get("differential")
    if diff:
        lines += [f"Differential: {diff['examples']} random scenarios through both targets in "
                  f"{diff['wall_s']:.2f} s = **{_num(diff['examples_per_s'])} examples/s** "
                  f"({_num(diff['examples_per_cpu_s'])} per CPU second); statuses "
                  f"{diff['statuses']}", ""]  # fmt: skip
        lines += [f"- divergence: {d}" for d in diff.get("divergences", [])]
    if scheduler.get("errors"):
        lines += [f"- error: {e}" for e in scheduler["errors"]] + [""]
    return lines


def _harness_lines(harness: dict[str, Any]) -> list[str]:
    lines = ["## Harness", ""]
    wedge = harness.get("wedge") or {}
    if "verdict_latency_s" in wedge:
        lines.append(f"- Wedge verdict latency on `{wedge['target']}` (stall bound "
                     f"{wedge['stall_s']} s): median **{wedge['verdict_latency_s']:.2f} s** "
                     f"from last progress to verdict (detection {wedge['detect_latency_s']:.2f} s;"
                     f" {len(wedge['samples'])} samples: "
                     + ", ".join(str(s.get("verdict_latency_s")) for s in wedge["samples"]) + ")")  # fmt: skip
    else:
        lines.append(f"- Wedge verdict latency: not measured ({wedge.get('error', 'skipped')})")
    for tried in wedge.get("tried", []):
        lines.append(f"  - tried `{tried['target']}`: {tried['outcome']}: {tried['error']}")
    suite = harness.get("default_suite") or {}
    if suite.get("elapsed_s") is not None:
        lines.append(f"- Default suite, `parity run --tier {suite['tier']}`: "
                     f"**{suite['elapsed_s']:.1f} s**, exit {suite['returncode']}, "
                     f"load {suite['loadavg_before']} -> {suite['loadavg_after']}")  # fmt: skip
    else:
        lines.append(f"- Default suite: not measured ({suite.get('error') or 'skipped'})")
    repeat = harness.get("repeat_suite") or {}
    if repeat.get("elapsed_s") is not None:
        first = repeat.get("first") or {}
        lines.append(f"- Default suite again beside a server broker, `--tier {repeat['tier']}`: "
                     f"{repeat['elapsed_s']:.1f} s (the run that started its servers: "
                     f"{first.get('elapsed_s')} s), exit {repeat['returncode']}, "
                     f"load {repeat['loadavg_before']} -> {repeat['loadavg_after']}")  # fmt: skip
    elif repeat:
        lines.append(f"- Default suite again beside a server broker: not measured "
                     f"({repeat.get('error') or repeat.get('note', 'skipped')})")  # fmt: skip
    clone = harness.get("fresh_clone") or {}
    shown = "not measured" if clone.get("elapsed_s") is None else f"{clone['elapsed_s']:.0f} s"
    detail = (
        clone.get("error")
        or clone.get("note")
        or (f"load {clone.get('loadavg_before')} -> {clone.get('loadavg_after')}")
    )
    lines += [f"- git clone to the make parity verdict: {shown} ({detail})", ""]
    return lines


def markdown(results: dict[str, Any]) -> str:
    """``results.md``: the targets table first, then each tier."""
    lines = [f"# Benchmark {results['run_id']}", ""]
    lines += _machine_lines(results)
    lines += ["## Targets", ""]
    rows = [[t["goal"], t["shown"], VERDICT[t["passed"]], t.get("note", "")]
            for t in results["targets"]]  # fmt: skip
    lines += _table(["target", "measured", "result", "note"], rows)
    if results.get("serve"):
        lines += _serve_lines(results["serve"])
    if results.get("scheduler"):
        lines += _scheduler_lines(results["scheduler"])
    if results.get("harness"):
        lines += _harness_lines(results["harness"])
    charts = results.get("charts", [])
    if charts:
        lines += ["## Charts", ""] + [f"![{c}]({c})" for c in charts] + [""]
    if results.get("errors"):
        lines += ["## Errors", ""] + [f"- {e}" for e in results["errors"]] + [""]
    return "\n".join(lines)


def charts(results: dict[str, Any]) -> dict[str, str]:
    """File name -> SVG text for every chart the results can draw."""
    out: dict[str, str] = {}
    serve = results.get("serve")
    if serve:
        startup = serve["startup"]
        out["startup.svg"] = grouped_bars(
            "Startup to /health (median)", "seconds", ["startup"],
            {s: [startup[s]["median_s"]] for s in SIDES},
            note=f"speed-up {_ratio(startup.get('speedup'))}",
        )  # fmt: skip
        names = [load["name"] for load in serve["loads"]]
        for file, key, title, unit in (
            ("throughput.svg", "output_tok_s", "Output tokens/s", "tokens/s"),
            ("ttft.svg", "ttft_p50_ms", "TTFT p50", "ms"),
            ("itl.svg", "itl_p50_ms", "ITL p50", "ms"),
            ("rss.svg", "peak_rss_mib", "Peak RSS of the server's process tree", "MiB"),
        ):
            out[file] = grouped_bars(
                title, unit, names, {s: [load[s][key] for load in serve["loads"]] for s in SIDES}
            )
    workloads = (results.get("scheduler") or {}).get("workloads") or []
    if workloads:
        out["scheduler.svg"] = grouped_bars(
            "Scheduler step time (CPU, median)", "ms per step",
            [w["workload"].split(" (")[0] for w in workloads],
            {s: [w[s]["ms_per_step_median"] for w in workloads] for s in SIDES},
        )  # fmt: skip
    return out


def write_run(run_dir: Path, results: dict[str, Any]) -> None:
    """Write the charts, ``results.json`` and ``results.md`` into ``run_dir``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    drawn = charts(results)
    for name, text in drawn.items():
        (run_dir / name).write_text(text, encoding="utf-8")
    results["charts"] = sorted(drawn)
    (run_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    (run_dir / "results.md").write_text(markdown(results), encoding="utf-8")


def update_latest(base: Path, run_dir: Path) -> Path:
    """Point ``base/latest`` at ``run_dir`` (relative symlink, replaced atomically; a copy
    where symlinks are not possible)."""
    latest = base / "latest"
    temp = base / f".latest-{os.getpid()}"
    try:
        if temp.is_symlink() or temp.exists():
            temp.unlink()
        temp.symlink_to(os.path.relpath(run_dir, base))
        if latest.exists() and not latest.is_symlink():
            shutil.rmtree(latest)
        os.replace(temp, latest)
    except OSError:
        if latest.is_symlink():
            latest.unlink()
        elif latest.exists():
            shutil.rmtree(latest)
        shutil.copytree(run_dir, latest)
    return latest
