"""Confirm before accuse: a server paused by a busy machine is not a hang.

Deterministic fault tests with the fake server (no model): one side's server process group is
paused with SIGSTOP while a request is in flight and resumed with SIGCONT. Paused for 1.5 x
``stall_s``, the request completes and the scenario passes; paused for the whole confirmation
window on the first attempt only, the stall it causes does not reproduce when the scenario
runs again on fresh servers: FLAKY, both attempts kept as evidence, exit status unaffected.
Every process is resumed and reaped whatever happens.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from serve_support import fake_target

from parity.ledger import Ledger, Verdict, classify
from parity.loader import parse_scenario
from parity.results import Status
from parity.serve.client import CONFIRM_FACTOR
from parity.serve.pool import ServerPool
from parity.serve.suite import run_serve_scenarios
from parity.serve.targets import parse_targets

pytestmark = pytest.mark.server

STALL_S = 1.0
SCENARIO = """\
id: slow-request
description: a non-streaming request the fake server answers after 2 s
tier: serve
requests:
  - {id: r1, endpoint: completions, prompt: slow, max_tokens: 5}
limits: {stall_s: 1.0, request_timeout_s: 30}
"""
LEFT, RIGHT = fake_target(), fake_target()


@contextmanager
def pause_once(pool: ServerPool, label: str, pause_s: float) -> Iterator[list[float]]:
    """A thread that, the first time the ``label`` server logs a request, pauses its whole
    process group for ``pause_s`` (SIGSTOP ... SIGCONT); always resumed on exit."""
    paused: list[float] = []
    done = threading.Event()
    groups: list[int] = []

    def watch() -> None:
        deadline = time.monotonic() + 60.0
        while not done.is_set() and time.monotonic() < deadline:
            for handle in pool.handles:
                if handle.label == label and handle.process is not None:
                    if "request slow" in handle.process.log_tail(4000):
                        groups.append(handle.process.pid)
                        os.killpg(handle.process.pid, signal.SIGSTOP)
                        paused.append(time.monotonic())
                        done.wait(pause_s)
                        os.killpg(handle.process.pid, signal.SIGCONT)
                        return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield paused
    finally:
        done.set()
        thread.join(timeout=10)
        for pgid in groups:
            try:
                os.killpg(pgid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def _run(tmp_path: Path, pause_s: float):
    scenario = parse_scenario(SCENARIO, "slow-request.yaml", stem="slow-request")
    with ServerPool(tmp_path / "logs") as pool:
        labels = [t.label for t in parse_targets([LEFT, RIGHT])]
        with pause_once(pool, labels[1], pause_s) as paused:
            (result,) = run_serve_scenarios([scenario], [LEFT, RIGHT], pool=pool)
        assert paused, "the fault was never injected"
    return scenario, result


@pytest.mark.timeout(120)
def test_a_pause_shorter_than_the_confirmation_window_is_no_hang(tmp_path: Path) -> None:
    scenario, result = _run(tmp_path, 1.5 * STALL_S)
    assert result.status is Status.PASS, result.verdict
    assert not result.attempts and not result.flaky
    assert [o.outcome for run in result.runs for o in run.observations] == ["completed"] * 2
    report = classify([result], Ledger("(none)", (), ()), {scenario.id: scenario})
    assert {f.verdict for f in report.findings} == {Verdict.PASS}


@pytest.mark.timeout(180)
def test_a_stall_that_does_not_reproduce_on_fresh_servers_is_flaky(tmp_path: Path) -> None:
    window = STALL_S * CONFIRM_FACTOR
    scenario, result = _run(tmp_path, window + 4.0)  # past the verdict and its evidence
    assert result.flaky and result.status is Status.PASS, result.verdict
    (first,) = result.attempts
    outcomes = [o.outcome for run in first.runs for o in run.observations]
    assert outcomes == ["completed", "zero_byte_hang"], outcomes
    assert first.suspects and "zero_byte_hang" in first.suspects[0]
    assert first.load is not None and first.runs[1].observations[0].stall is not None
    assert [o.outcome for run in result.runs for o in run.observations] == ["completed"] * 2
    assert result.verdict.startswith("flaky:")
    report = classify([result], Ledger("(none)", (), ()), {scenario.id: scenario})
    verdicts = {f.verdict for f in report.findings}
    assert Verdict.FLAKY in verdicts and Verdict.NEW not in verdicts
    assert report.exit_code == 0


DRAW_SCENARIO = """\
id: unseeded-draw
description: one sampled token, no seed
tier: serve
requests:
  - {{id: r1, endpoint: completions, prompt: draw, max_tokens: 1{extra}}}
limits: {{stall_s: 5.0, request_timeout_s: 30}}
"""


def _draw(tmp_path: Path, left: str, right: str, extra: str = ""):
    scenario = parse_scenario(DRAW_SCENARIO.format(extra=extra), "d.yaml", stem="unseeded-draw")
    targets = [fake_target("--draw", left), fake_target("--draw", right)]
    with ServerPool(tmp_path / "logs") as pool:
        (result,) = run_serve_scenarios([scenario], targets, pool=pool)
    report = classify([result], Ledger("(none)", (), ()), {scenario.id: scenario})
    return result, report


@pytest.mark.timeout(120)
def test_an_unseeded_draw_that_changes_on_fresh_servers_is_flaky(tmp_path: Path) -> None:
    # one side draws anew on every request (as a real server's unseeded draws depend on which
    # requests shared its steps), the other always draws t0
    result, report = _draw(tmp_path, "random", "0")
    assert result.flaky and result.status is Status.PASS, result.verdict
    (first,) = result.attempts
    assert first.suspects and first.suspects[0].startswith("requests.r1."), first.suspects
    texts = [o.result.text for run in (*first.runs, *result.runs) for o in run.observations]
    assert texts[1] == texts[3] == " t0" and texts[0] != texts[2], texts  # it drew again
    assert not result.divergences  # neither draw is a finding
    verdicts = {f.verdict for f in report.findings}
    assert Verdict.FLAKY in verdicts and Verdict.NEW not in verdicts
    assert report.exit_code == 0


@pytest.mark.timeout(120)
def test_an_unseeded_draw_that_reproduces_is_reported(tmp_path: Path) -> None:
    result, report = _draw(tmp_path, "1", "2")  # each server draws the same every time
    assert not result.flaky and result.status is Status.DIVERGENCE, result.verdict
    assert len(result.attempts) == 1 and "reproduced on fresh servers" in result.verdict
    new = [f for f in report.findings if f.verdict is Verdict.NEW]
    assert new and {f.signature for f in new} == {"other"}, [f.describe() for f in new]


@pytest.mark.timeout(120)
def test_a_greedy_or_seeded_draw_is_not_rerun(tmp_path: Path) -> None:
    for extra, signature in ((", temperature: 0", "other"), (", seed: 3", "sampling")):
        result, report = _draw(tmp_path / signature, "1", "2", extra)
        assert not result.attempts and result.status is Status.DIVERGENCE, result.verdict
        new = [f for f in report.findings if f.verdict is Verdict.NEW]
        assert new and {f.signature for f in new} == {signature}, [f.describe() for f in new]
