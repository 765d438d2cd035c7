"""Verdicts a CI can trust on a busy machine.

The whole default suite (both tiers, engine vs oracle, exactly as ``make parity`` runs it) while
the machine is kept busy for the whole run: one CPU-bound process per core plus one process
doing heavy disk I/O (direct writes synced to disk in a loop), all started by the test in their own
process groups and reaped whatever happens. It must exit 0 with no NEW divergence; a FLAKY
result (a timing difference that did not reproduce on fresh servers) is allowed and listed with
its evidence. Then the port's wedge (``oracle[unchecked]`` on the port-wedge config, under the
same load) must still be reported as a wedge, within its bound.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from parity.bench.suite import timed_command
from parity.process import ManagedProcess
from parity.repro.cli import main as repro_main
from parity.serve.lease import ENV

ROOT = Path(__file__).resolve().parents[2]
HANGS = ROOT / "scenarios" / "hangs"
SUITE_TIMEOUT_S = 1800

pytestmark = [pytest.mark.oracle, pytest.mark.server, pytest.mark.alone]

CPU_HOG = "while True: pass"
# A direct-I/O writer: 64 MiB rewritten in place, 1 MiB at a time, synced each round, forever
# (O_DIRECT where the filesystem has it, not on tmpfs: the writes reach the disk, not the page
# cache). In place rather than truncated and rewritten each round, so the disk is kept busy
# without also churning the filesystem's block allocator; docs/oracle-on-cpu.md ("Under load")
# has what was measured with each writer.
DISK_HOG = """
import mmap, os, sys
path, size, block = sys.argv[1], 64 << 20, 1 << 20
with open(path, "wb") as handle:
    handle.truncate(size)
try:
    fd = os.open(path, os.O_WRONLY | getattr(os, "O_DIRECT", 0))
except OSError:
    fd = os.open(path, os.O_WRONLY)
buffer = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT needs
buffer.write(os.urandom(block))
while True:
    for offset in range(0, size, block):
        os.pwrite(fd, buffer, offset)
    os.fdatasync(fd)
"""


def own_servers() -> dict[str, str]:
    """Our environment without the session's server broker: ``make parity`` on a busy machine
    starts every server itself, under the load."""
    return {k: v for k, v in os.environ.items() if k != ENV}


@contextmanager
def busy_machine(folder: Path) -> Iterator[list[ManagedProcess]]:
    """As many CPU-bound processes as cores plus one disk writer, each in its own process
    group; all stopped and reaped on exit (and, being tracked, if pytest gets SIGTERM)."""
    procs: list[ManagedProcess] = []
    try:
        for i in range(os.cpu_count() or 1):
            argv = [sys.executable, "-c", CPU_HOG]
            procs.append(ManagedProcess(argv, log_path=folder / f"cpu-hog-{i}.log"))
        argv = [sys.executable, "-c", DISK_HOG, str(folder / "disk-hog.bin")]
        procs.append(ManagedProcess(argv, log_path=folder / "disk-hog.log"))
        time.sleep(1.0)
        assert all(p.alive() for p in procs), "a load generator died at once"
        yield procs
    finally:
        for proc in procs:
            proc.stop(grace_s=5.0)


@pytest.mark.timeout(SUITE_TIMEOUT_S + 300)
def test_the_default_suite_on_a_busy_machine_has_no_false_new(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    with busy_machine(tmp_path) as procs:
        began = time.monotonic()
        # bounded; on timeout its group gets SIGTERM first, so the run stops its own servers
        done = timed_command(
            [sys.executable, "-m", "parity.cli", "run", "--tier", "both", "--no-progress",
             "--report", str(reports), "--json", str(tmp_path / "run.json")],
            cwd=ROOT, log=tmp_path / "run.log", timeout_s=SUITE_TIMEOUT_S, env=own_servers(),
        )  # fmt: skip
        elapsed = time.monotonic() - began
        assert all(p.alive() for p in procs), "the load stopped before the run ended"
        load = os.getloadavg()
    output = (tmp_path / "run.log").read_text(encoding="utf-8", errors="replace")
    assert "error" not in done and done["returncode"] == 0, (done, output[-6000:])
    run = json.loads((tmp_path / "run.json").read_text())
    counts = run["ledger"]["counts"]
    flaky = [r for r in run["results"] if r.get("flaky")]
    print(f"busy-machine suite: {elapsed:.0f} s, load at the end {load}, counts {counts}")
    for result in flaky:  # allowed, but listed with both observations
        first = result["attempts"][0]
        print(f"FLAKY {result['scenario_id']}: {first['suspects']} (load {first['load']})")
    assert counts["NEW"] == 0 and counts["STALE"] == 0, output[-6000:]
    assert len(run["results"]) >= 50


@pytest.mark.timeout(900)
def test_a_genuine_wedge_is_still_reported_on_a_busy_machine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with busy_machine(tmp_path):
        code = repro_main(
            [str(HANGS / "port-wedge-serve.repro.yaml"), "--target", "oracle[unchecked]",
             "--leg", "wedge", "--out", str(tmp_path)]
        )  # fmt: skip
    out = capsys.readouterr().out
    print(out)
    assert code == 0, out
    assert "zero_byte_hang (self_preemption_wedge)" in out
    latencies = [float(x) for x in re.findall(r"verdict latency (\d+\.\d+) s", out)]
    assert latencies and max(latencies) <= 5.0, latencies  # fast: the scheduler shows the wedge
