"""WorkerTarget: the protocol over a subprocess, every failure one bounded, clear error.

Misbehaving workers are ``workers/fake_worker.py MODE``; the well-behaved one is our engine's
(``python -m engine.core.scheduler_worker``), which must give the in-process engine's verdicts.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from parity_helpers import ROOT, SCENARIOS

from parity.errors import TargetStartError
from parity.loader import load_scenario, load_scenarios
from parity.runner import run_scenario, run_target
from parity.targets import make_target
from parity.targets.worker import WorkerTarget

pytestmark = pytest.mark.timeout(120)

FAKE = Path(__file__).parent / "workers" / "fake_worker.py"
ENGINE_WORKER = [sys.executable, "-m", "engine.core.scheduler_worker"]
TEXT = """\
id: tiny
description: one request
tier: scheduler
config: {block_size: 16, num_gpu_blocks_override: 4}
requests:
  - {id: a, prompt_token_ids: [389, 1], max_tokens: 2}
limits: {max_steps: 20, stall_steps: 3}
"""


@pytest.fixture
def tiny(write_yaml: Callable[[str, str], Path]) -> Any:
    return load_scenario(write_yaml("tiny", TEXT))


@pytest.fixture
def fake() -> Iterator[Callable[..., WorkerTarget]]:
    made: list[WorkerTarget] = []

    def make(mode: str, **timeouts: float) -> WorkerTarget:
        values = {"hello_timeout_s": 10.0, "start_timeout_s": 10.0, "step_timeout_s": 1.0}
        values.update(timeouts)
        target = WorkerTarget(f"fake-{mode}", [sys.executable, str(FAKE), mode], **values)
        made.append(target)
        return target

    yield make
    for target in made:
        target.shutdown()


def test_a_crash_at_hello_is_a_start_error_with_exit_code_and_stderr(fake: Any, tiny: Any) -> None:
    target = fake("crash-at-hello")
    with pytest.raises(TargetStartError) as info:
        target.start(tiny.config)
    message = str(info.value)
    assert "exited with code 3 during hello" in message and "\n" not in message
    assert "last stderr: fake worker: cannot import its scheduler" in message
    run = run_target(tiny, target)  # the runner reports it as a target that did not start
    assert not run.summary.started and "exited with code 3" in (run.summary.error or "")


def test_a_crash_mid_scenario_is_the_runs_error(fake: Any, tiny: Any) -> None:
    run = run_target(tiny, fake("crash-at-step"))
    error = run.summary.error or ""
    assert run.summary.started and error.startswith("step 1: WorkerError: fake-crash-at-step:")
    assert "exited with code 7 during step" in error and "step went wrong" in error
    assert run.summary.outcomes["a"].outcome == "crashed"


@pytest.mark.parametrize(
    ("mode", "phase", "expected"),
    [
        ("hang-at-hello", "start", "no answer to hello within 1 s"),
        ("hang-at-step", "step", "no answer to step within 1 s"),
        ("garbage-at-step", "step", "garbage on stdout during step: not JSON"),
        ("wrong-shape", "step", "bad step response: trace fields: missing"),
        ("two-lines", "step", "more than one line for one request"),
        ("version-2", "start", "does not speak protocol 1 (hello answered 2)"),
    ],
)
def test_hangs_garbage_and_wrong_versions_are_one_bounded_error(
    fake: Any, tiny: Any, mode: str, phase: str, expected: str
) -> None:
    target = fake(mode, hello_timeout_s=1.0)
    began = time.monotonic()
    run = run_target(tiny, target)
    assert time.monotonic() - began < 20
    error = run.summary.error or ""
    assert expected in error and "\n" not in error, error
    assert run.summary.started is (phase == "step")
    assert target._process is None  # reaped: the next scenario gets a fresh worker


def test_a_broken_worker_is_replaced_at_the_next_start(fake: Any, tiny: Any) -> None:
    target = fake("crash-at-step")
    first = run_target(tiny, target)
    second = run_target(tiny, target)
    assert first.summary.started and second.summary.started  # a new process each time
    assert "exited with code 7" in (second.summary.error or "")


def test_the_process_is_reused_and_its_whole_group_reaped(fake: Any, tiny: Any) -> None:
    target = fake("spawn-child")
    run_target(tiny, target)
    assert target._process is not None
    pid, child = target._process.proc.pid, int(target.implementation or 0)
    run = run_target(tiny, target)
    assert target._process.proc.pid == pid  # one worker for both scenarios
    assert run.summary.notes == ("fake note",)
    os.kill(child, 0)  # the child lives while the worker does
    target.shutdown()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
        return stat.read().split()[2] != "Z"


def test_a_python_workers_stray_output_goes_to_stderr(tiny: Any) -> None:
    noisy = Path(__file__).parent / "workers" / "noisy_worker.py"
    target = WorkerTarget("noisy", [sys.executable, str(noisy)], cwd=ROOT, step_timeout_s=10)
    try:
        run = run_target(tiny, target)
        assert run.summary.started and run.summary.error is None and run.summary.wedge is not None
        assert run.summary.notes == ("noisy",)
        assert target._process is not None
        tail = "\n".join(target._process.stderr_tail)
        for text in (
            "print() during start",
            "logging to sys.stdout",
            "raw write to fd 1 during step",
        ):
            assert text in tail
    finally:
        target.shutdown()


def test_an_unreadable_model_folder_is_a_start_error(tiny: Any, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json", encoding="utf-8")
    target = WorkerTarget("nowhere", ["/nonexistent/worker"], model_dir=tmp_path)
    with pytest.raises(TargetStartError, match=f"nowhere: cannot read {tmp_path}: Expecting"):
        target.start(tiny.config)


def test_an_unrunnable_command_is_a_start_error(tiny: Any) -> None:
    target = WorkerTarget("nowhere", ["/nonexistent/worker"])
    with pytest.raises(TargetStartError, match="cannot run '/nonexistent/worker'"):
        target.start(tiny.config)


def test_the_worker_spec_takes_the_whole_command(tiny: Any) -> None:
    target = make_target(f"worker:{sys.executable} {FAKE} ok")
    try:
        assert isinstance(target, WorkerTarget)
        assert target.command == [sys.executable, str(FAKE), "ok"]
        assert target.name == f"worker:{sys.executable} {FAKE} ok"
        assert run_target(tiny, target).summary.wedge is not None  # the fake never finishes
    finally:
        target.shutdown()  # type: ignore[attr-defined]


def test_engine_worker_refuses_and_reports_startup_like_in_process(
    scripted_model_dir: Path, write_yaml: Callable[[str, str], Path]
) -> None:
    too_long = TEXT.replace("id: tiny", "id: toolong").replace("}", ", max_model_len: 100000}", 1)
    refused = load_scenario(write_yaml("toolong", too_long))
    worker = WorkerTarget("engine-worker", ENGINE_WORKER, cwd=ROOT, model_dir=scripted_model_dir)
    try:
        in_process = run_target(refused, make_target(f"engine:{scripted_model_dir}"))  # type: ignore[arg-type]
        via_worker = run_target(refused, worker)
        assert not via_worker.summary.started
        assert (via_worker.summary.error or "").startswith("engine refuses the config:")
        assert via_worker.summary.error == in_process.summary.error
        wedge = load_scenarios([SCENARIOS / "port-wedge-bs16.yaml"])[0]
        run_target(wedge, worker)
        assert worker.startup is not None and worker.startup.refused
        assert "estimated maximum model length is 48" in (worker.startup.message or "")
    finally:
        worker.shutdown()


def test_engine_worker_gives_the_in_process_verdicts(scripted_model_dir: Path) -> None:
    """The scheduler suite, engine via the protocol vs in-process: parity, and the same
    verdicts as in-process vs in-process, scenario by scenario."""
    worker = WorkerTarget("engine-worker", ENGINE_WORKER, cwd=ROOT, model_dir=scripted_model_dir)
    engine = make_target(f"engine:{scripted_model_dir}")
    other = make_target(f"engine:{scripted_model_dir}")
    try:
        for scenario in load_scenarios([ROOT / "scenarios"]):
            if not scenario.runs_at_scheduler_tier:
                continue
            reference, _ = run_scenario(scenario, [engine, other])  # type: ignore[list-item]
            result, _ = run_scenario(scenario, [engine, worker])  # type: ignore[list-item]
            assert (result.status, result.verdict) == (reference.status, reference.verdict)
            assert not result.divergences, scenario.id
    finally:
        worker.shutdown()
