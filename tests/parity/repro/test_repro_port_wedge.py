"""Acceptance of ``parity repro`` on the port's wedge at the serve tier.

1. ``port-wedge-serve`` on ``engine --divergence legacy-capacity`` and ``oracle[unchecked]``:
   the control leg completes on both; the wedge leg is a zero-byte hang on both (a
   self-preemption wedge), /health green, with the SIGTERM outcome for each; verdict latency
   (last progress -> verdict) measured and printed; the legs' time (servers up) printed.
2. The same file against the unmodified oracle: the oracle refuses to start ("estimated
   maximum model length is 64", the block-size-32 analogue of the port's 48), the engine with
   ``legacy-capacity`` starts and wedges, and the divergence is ``capacity_overhang``.
3. ``sigterm-ignored-while-wedged``: the engine survives SIGTERM and needs SIGKILL.
Every run writes its Markdown record with the legs table.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from repro_support import HANGS

FILE = str(HANGS / "port-wedge-serve.repro.yaml")
LEGACY = "engine --divergence legacy-capacity"
Cli = Callable[..., tuple[int, str, str]]

pytestmark = pytest.mark.server


def _table(record: Path) -> list[list[str]]:
    rows = [line for line in record.read_text().splitlines() if line.startswith("| ")]
    assert rows[0] == "| leg | target | flags | result | time |"
    return [[cell.strip() for cell in row.strip("|").split(" | ")] for row in rows[1:]]


def _verdict(out: str, leg: str, target: str) -> str:
    lines = out.splitlines()
    start = lines.index(next(line for line in lines if line.startswith(f"[{leg}] {target}: ")))
    block = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith("    "):
            break
        block.append(line)
    return "\n".join(block)


@pytest.mark.oracle
@pytest.mark.timeout(900)
def test_port_wedge_on_legacy_engine_and_unchecked_oracle(run_cli: Cli, tmp_path: Path) -> None:
    code, out, err = run_cli(
        FILE, "--target", LEGACY, "--target", "oracle[unchecked]", "--out", str(tmp_path)
    )
    print(out)
    assert code == 0, out + err
    for target in (LEGACY, "oracle[unchecked]"):
        control = _verdict(out, "control", target)
        assert re.search(r"completed: HTTP 200, \d+ bytes, 16 tokens, finish length", control)
        wedge = _verdict(out, "wedge", target)
        head = "zero_byte_hang (self_preemption_wedge): no status line, 0 bytes, 0 tokens"
        assert head in wedge and "/health 200 (green while wedged)" in wedge
        assert "metrics running 0, waiting 1 (capacity 1)" in wedge
        assert re.search(
            r"SIGTERM while wedged: 1 request\(s\) outstanding; (exited \d|survived)", wedge
        )
    legacy = _verdict(out, "wedge", LEGACY)
    assert "it can never be scheduled (wedged)" in legacy  # the /debug/scheduler explanation
    assert re.search(r"exited \d+\.\d+ s after SIGTERM \(rc 0\)", legacy)
    latencies = [float(x) for x in re.findall(r"verdict latency (\d+\.\d+) s", out)]
    # One per wedge attempt: the oracle's SIGTERM outcome while wedged varies from run to run
    # (it survived once and exited on the rerun in CI), and a lone `survived` is confirmed on a
    # fresh server, which adds an attempt.
    attempts = sum(1 for line in out.splitlines() if line.startswith("[wedge] "))
    assert attempts >= 2 and len(latencies) == attempts, (attempts, latencies)
    assert max(latencies) <= 5.0, latencies
    legs_s = float(re.search(r"time: (\d+\.\d+) s in legs", out).group(1))
    print(f"verdict latencies {latencies} s; legs (servers up) {legs_s} s")
    assert legs_s <= 60.0  # the goal is 15 s; bounded generously for a loaded 2-core CI
    rows = _table(tmp_path / "port-wedge-serve.md")
    assert [(r[0], r[1]) for r in rows] == [
        ("control", f"`{LEGACY}`"), ("control", "`oracle[unchecked]`"),
        ("wedge", f"`{LEGACY}`"), ("wedge", "`oracle[unchecked]`"),
    ]  # fmt: skip
    assert "--num-gpu-blocks-override 3" in rows[2][2] and "max_tokens 90" in rows[2][2]
    assert all(r[3].startswith("zero_byte_hang (self_preemption_wedge)") for r in rows[2:])


@pytest.mark.oracle
@pytest.mark.timeout(600)
def test_unmodified_oracle_refuses_and_the_divergence_is_capacity_overhang(
    run_cli: Cli, tmp_path: Path
) -> None:
    code, out, err = run_cli(
        FILE, "--target", LEGACY, "--target", "oracle", "--leg", "wedge", "--out", str(tmp_path)
    )
    print(out)
    assert code == 0, out + err  # the file expects the refusal
    refused = _verdict(out, "wedge", "oracle")
    assert "startup_refused: ValueError:" in refused
    assert "estimated maximum model length is 64" in refused
    assert "zero_byte_hang (self_preemption_wedge)" in _verdict(out, "wedge", LEGACY)
    assert re.search(r"divergence in wedge: capacity_overhang", out)
    record = (tmp_path / "port-wedge-serve.md").read_text()
    assert re.search(
        r"`wedge` `startup` \(.*port-wedge-serve.repro.yaml:\d+\).*\*\*capacity_overhang\*\*",
        record,
    )
    rows = _table(tmp_path / "port-wedge-serve.md")
    assert rows[1][1] == "`oracle`" and rows[1][3].startswith("startup_refused: ValueError")


@pytest.mark.timeout(400)
def test_sigterm_ignored_while_wedged_survives(run_cli: Cli, tmp_path: Path) -> None:
    target = f"{LEGACY} --divergence sigterm-ignored-while-wedged"
    code, out, err = run_cli(FILE, "--target", target, "--leg", "wedge", "--out", str(tmp_path))
    print(out)
    assert code == 0, out + err
    wedge = _verdict(out, "wedge", target)
    assert re.search(
        r"survived SIGTERM for the 5 s grace period; SIGKILL after \d+\.\d+ s \(rc -9\)", wedge
    )
    assert "SIGTERM: survived" in _table(tmp_path / "port-wedge-serve.md")[0][3]
