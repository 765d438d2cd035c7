"""Helpers shared by the parity tests (imported by module name; conftest only holds fixtures).

The differential test's example counts follow the hypothesis profile loaded by
``tests/conftest.py``: 300 under ``ci`` (the default, derandomized) and 5,000 under ``deep``
(``HYPOTHESIS_PROFILE=deep``, random), applied per test by ``differential_settings``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings

from contract.trace import StepTrace
from parity.process import ManagedProcess

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios" / "scheduler"

# Examples per profile, set here rather than by the profile: these examples are slow.
_EXAMPLES = {"ci": 300, "deep": 5000}


def differential_settings(**overrides: Any) -> settings:
    """The loaded profile (``ci`` or ``deep``), with the differential test's example count."""
    name = settings.get_current_profile_name()
    values: dict[str, Any] = {
        "max_examples": _EXAMPLES.get(name, _EXAMPLES["ci"]),
        "deadline": None,
        "database": None,
        "print_blob": True,
        "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
    }
    values.update(overrides)
    return settings(settings.get_profile(name), **values)


def make_trace(step: int, **fields: Any) -> StepTrace:
    """A StepTrace with empty defaults; pass only the fields a test cares about."""
    values: dict[str, Any] = {
        "step": step,
        "num_scheduled_tokens": {},
        "scheduled_new_req_ids": (),
        "scheduled_resumed_req_ids": (),
        "scheduled_running_req_ids": (),
        "preempted_req_ids": (),
        "finished": {},
        "stop_reasons": {},
        "sampled_token_ids": {},
        "block_ids": {},
        "num_computed_tokens": {},
        "running": (),
        "waiting": (),
        "num_free_blocks": 0,
    }
    values.update(fields)
    return StepTrace(**values)


def verdict(result: Any) -> tuple[Any, ...]:
    """What a scenario's verdict is made of: status, verdict text, and every divergence's step,
    path and values (to compare two runs of one scenario, e.g. in-process vs a worker)."""
    paths = tuple((d.step, d.path, str(d.left), str(d.right)) for d in result.divergences)
    return result.status, result.verdict, paths


def run_process(argv: list[str], timeout: float = 60) -> tuple[int, str, str]:
    """Run ``argv`` in its own process group from the repo root; always reaped (TERM, KILL)."""
    process = subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        process_group=0,
    )
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=5)
    return process.returncode, out, err


def started_python(
    code: str, log_path: Path, *, env: dict[str, str] | None = None, timeout_s: float = 30.0
) -> ManagedProcess:
    """``python -c code`` as a ``ManagedProcess``, once its log says "ready" (bounded); stopped,
    with an AssertionError carrying its log, when it exits or the bound passes first."""
    process = ManagedProcess([sys.executable, "-c", code], log_path=log_path, env=env)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.alive():
        if b"ready" in process.log_path.read_bytes():
            return process
        time.sleep(0.05)
    process.stop(grace_s=0.1)
    raise AssertionError(f"the child never got ready: {process.log_tail()}")
