"""Run the default suite against a worked port example exactly as its README says.

``parity --config ports/<name>/parity.toml run @default --target oracle --target <name>`` in a
subprocess from the repository root, bounded; the tests in this folder check that it exits 0
(every finding has a decision in the example's ledger), that nothing is NEW or STALE, that the
grouped summary names the expected UNSUPPORTED reasons, and that it fits on a screen.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from parity.bench.suite import timed_command

ROOT = Path(__file__).resolve().parents[2]
SUITE_TIMEOUT_S = 3000.0  # both servers restart per config; an oracle start takes minutes here
SCREEN_LINES = 40
_LEDGER = re.compile(r"^ledger: (\d+) pass, (\d+) known, (\d+) new, (\d+) stale, (\d+) unsupported")
# the grouped summary: one line per cause (KNOWN/NEW ...) and per UNSUPPORTED reason
_GROUPED = re.compile(r"^(PASS|KNOWN|NEW|STALE|FLAKY|UNSUPPORTED) ")


@dataclass(frozen=True)
class SuiteRun:
    returncode: int
    out: str
    seconds: float

    @property
    def counts(self) -> dict[str, int]:
        line = next(ln for ln in self.out.splitlines() if _LEDGER.match(ln))
        found = _LEDGER.match(line)
        assert found is not None
        names = ("pass", "known", "new", "stale", "unsupported")
        return dict(zip(names, map(int, found.groups()), strict=True))

    @property
    def grouped(self) -> list[str]:
        return [ln for ln in self.out.splitlines() if _GROUPED.match(ln)]

    def unsupported_reasons(self) -> list[str]:
        return [ln for ln in self.grouped if ln.startswith("UNSUPPORTED ")]


def command(name: str) -> list[str]:
    """The README's command for port ``name`` (the harness from this checkout)."""
    config = f"ports/{name}/parity.toml"
    run = ["run", "@default", "--target", "oracle", "--target", name, "--no-progress"]
    return [sys.executable, "-m", "parity.cli", "--config", config, *run]


def run_port(name: str, log_dir: Path) -> SuiteRun:
    """The suite in its own process group (``timed_command``): bounded, and on timeout the
    harness gets SIGTERM first, so it reaps the servers it started before its group is killed."""
    env = dict(os.environ)  # with the session's server broker, when there is one
    log = log_dir / f"{name}.log"
    done = timed_command(command(name), cwd=ROOT, log=log, timeout_s=SUITE_TIMEOUT_S, env=env)
    seconds = done["elapsed_s"]
    print(f"{name}: the default suite took {seconds:.0f} s")  # the wall time, shown with -s
    output = log.read_text(encoding="utf-8", errors="replace")
    if "not finished within" in done.get("error", ""):
        output += f"\n{done['error']}"
    return SuiteRun(done["returncode"], output, seconds)


def check(run: SuiteRun, expected_unsupported: list[str]) -> None:
    """Exit 0, no NEW and no STALE, each expected reason in one UNSUPPORTED line, on a screen."""
    assert run.returncode == 0, run.out[-6000:]
    counts = run.counts
    assert counts["new"] == 0 and counts["stale"] == 0, run.out[-6000:]
    assert counts["known"] > 0  # the example does find things: each has its decision
    reasons = run.unsupported_reasons()
    for reason in expected_unsupported:
        assert any(reason in line for line in reasons), (reason, reasons)
    assert len(run.grouped) <= SCREEN_LINES, "\n".join(run.grouped)
