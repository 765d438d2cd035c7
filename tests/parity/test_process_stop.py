"""``ManagedProcess.stop``: SIGTERM, the grace period, its extension for a process that is
shutting down, then SIGKILL (``parity/process.py``)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from parity_helpers import started_python

from parity.process import MAIN_WAIT_SLICE_S, ManagedProcess, slices

pytestmark = pytest.mark.timeout(60)

# SIGTERM starts a 1.5 s shutdown; the process exits when it is done
SLOW_EXIT = """
import signal, sys, time
def on_term(signum, frame):
    time.sleep(1.5)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
time.sleep(60)
"""
IGNORES = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
"""


def _started(code: str, tmp_path: Path) -> ManagedProcess:
    return started_python(code, tmp_path / "p.log", timeout_s=20.0)  # until the handler is in


def test_a_slow_exit_past_the_grace_is_waited_for_while_it_shuts_down(tmp_path: Path) -> None:
    process = _started(SLOW_EXIT, tmp_path)
    record = process.stop(grace_s=0.3, extension_s=5.0, shutting_down=lambda: True)
    assert record.sigterm_sufficed, record
    assert record.extended_s == 5.0
    assert 1.0 < record.exit_s < 5.0, record
    assert record.returncode == 0


def test_a_slow_exit_still_serving_is_killed_at_the_grace(tmp_path: Path) -> None:
    process = _started(SLOW_EXIT, tmp_path)
    record = process.stop(grace_s=0.3, extension_s=5.0, shutting_down=lambda: False)
    assert not record.sigterm_sufficed, record
    assert record.extended_s == 0.0
    assert record.exit_s < 1.4, record  # SIGKILL at the grace, not after the handler


def test_an_ignored_sigterm_is_killed_after_the_extension(tmp_path: Path) -> None:
    process = _started(IGNORES, tmp_path)
    record = process.stop(grace_s=0.2, extension_s=0.5, shutting_down=lambda: True)
    assert not record.sigterm_sufficed, record
    assert record.extended_s == 0.5
    assert 0.6 < record.exit_s < 5.0, record
    assert record.returncode == -9


# binds a Unix socket in the folder VLLM_RPC_BASE_PATH names and leaves it there, as vLLM does;
# {sigterm} is what SIGTERM does to it (default: exit; SIG_IGN: only SIGKILL ends it)


def test_slices_cut_a_long_wait_into_short_ones() -> None:
    began = time.monotonic()
    waits = []
    for wait_s in slices(1.0):
        waits.append(wait_s)
        time.sleep(wait_s)
    spent = time.monotonic() - began
    assert all(0 < w <= MAIN_WAIT_SLICE_S for w in waits), waits
    assert len(waits) >= 1.0 / MAIN_WAIT_SLICE_S
    assert 1.0 <= spent < 1.0 + MAIN_WAIT_SLICE_S + 0.5  # the whole bound, not one slice more
    assert list(slices(0.0)) == [] and list(slices(-1.0)) == []
