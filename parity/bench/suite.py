"""Harness tier of the benchmark, measured end to end: the default suite's wall time and the
time from ``git clone`` to the ``make parity`` verdict.

Both run as subprocesses in their own process group (``parity.process.ManagedProcess``), each
bounded by a deadline and reaped with its group whatever happens; each records the load
average before and after, because a wall time on a shared machine means little without it.

- ``default_suite``: ``parity run @default --tier both`` (engine vs oracle), the command
  ``make parity`` runs (the scheduler tier beside the first server starts), into a scratch
  report folder (the project's ``reports/`` is left alone).
- ``repeat_suite``: the same, twice, with a server broker (``parity broker``) for the two
  runs: the first starts the oracle servers, the second, timed, leases them, as a port
  maintainer's next run does when a broker is running (docs/server-broker.md).
- ``fresh_clone``: ``git clone`` of this checkout's ``HEAD`` into a scratch folder, then
  ``make parity`` there. "Warm package cache" means uv's and pip's caches as they are on this
  machine (nothing is downloaded twice); the clone's ``.venv``, models and reports start empty.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from parity.process import ManagedProcess
from parity.serve.spec import ROOT

SUITE_TIER = "both"  # what make parity runs; --quick runs "scheduler" (no servers)
SUITE_TIMEOUT_S = 900.0
CLONE_TIMEOUT_S = 1200.0


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def timed_command(argv: Sequence[str], *, cwd: Path, log: Path, timeout_s: float,
                  env: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """Run ``argv`` to its end (bounded): wall time, exit code, load before and after, log."""
    before = _load()
    began = time.monotonic()
    proc = ManagedProcess(argv, log_path=log, cwd=cwd, env=env)
    timed_out = False
    try:
        proc.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        record = proc.stop()
    took = time.monotonic() - began
    result: dict[str, Any] = {
        "elapsed_s": round(took, 1), "returncode": record.returncode,
        "loadavg_before": before, "loadavg_after": _load(), "log": str(log),
    }  # fmt: skip
    if timed_out:
        result["error"] = f"not finished within {timeout_s:.0f} s"
    elif record.returncode not in (0, 1):
        result["error"] = f"exit code {record.returncode} (log: {log})"
    return result


def cold_env() -> dict[str, str]:
    """Our environment without a server broker: the timed runs start every server themselves,
    as on a machine where nothing runs yet."""
    from parity.serve.lease import ENV

    return {k: v for k, v in os.environ.items() if k != ENV}


def default_suite(logs: Path, *, tier: str = SUITE_TIER,
                  timeout_s: float = SUITE_TIMEOUT_S, env: dict[str, str] | None = None,
                  name: str = "suite") -> dict[str, Any]:  # fmt: skip
    """The bundled default suite, engine vs oracle, as one ``parity run --tier TIER``; ``env``
    defaults to ``cold_env()``; ``name`` prefixes its log and report folder."""
    argv = [sys.executable, "-m", "parity.cli", "run", "@default", "--tier", tier,
            "--target", "engine", "--target", "oracle", "--report", str(logs / name)]  # fmt: skip
    run = timed_command(argv, cwd=ROOT, log=logs / f"{name}.log", timeout_s=timeout_s,
                        env=cold_env() if env is None else env)  # fmt: skip
    out: dict[str, Any] = {"tier": tier, **run}
    if "error" in run:
        out["error"] = f"--tier {tier}: {run['error']}"
        out["elapsed_s"] = None
    else:
        out["verdict"] = f"exit {run['returncode']}"
    return out


BROKER_READY_S = 60.0
BROKER_STOP_S = 120.0  # the broker stops each server it holds before it exits


def repeat_suite(logs: Path, *, tier: str = SUITE_TIER) -> dict[str, Any]:
    """The default suite twice beside one ``parity broker``; the second run is the result
    (``first`` holds the run that started the servers)."""
    from parity.serve.lease import ENV

    folder = Path(tempfile.mkdtemp(prefix="parity-bench-broker-"))
    socket_path = folder / "broker.sock"
    argv = [sys.executable, "-m", "parity.serve.broker", "--socket", str(socket_path),
            "--log-dir", str(logs / "broker"), "--parent", str(os.getpid())]  # fmt: skip
    broker = ManagedProcess(argv, log_path=logs / "broker.log", cwd=ROOT, env=cold_env())
    try:
        deadline = time.monotonic() + BROKER_READY_S
        while not socket_path.exists():
            if not broker.alive() or time.monotonic() > deadline:
                return {"elapsed_s": None, "error": f"no broker (log: {logs / 'broker.log'})"}
            time.sleep(0.05)
        env = {**cold_env(), ENV: str(socket_path)}
        first = default_suite(logs, tier=tier, env=env, name="repeat-first")
        if "error" in first:
            return {"elapsed_s": None, "error": f"first run: {first['error']}", "first": first}
        return {**default_suite(logs, tier=tier, env=env, name="repeat"), "first": first}
    finally:
        broker.stop(grace_s=BROKER_STOP_S)
        shutil.rmtree(folder, ignore_errors=True)


def fresh_clone(logs: Path, *, timeout_s: float = CLONE_TIMEOUT_S) -> dict[str, Any]:
    """``git clone`` HEAD into a scratch folder and time ``make parity`` there."""
    scratch = Path(tempfile.mkdtemp(prefix="parity-clone-"))
    try:
        began = time.monotonic()
        clone = scratch / "clone"
        cloned = timed_command(["git", "clone", "--quiet", str(ROOT), str(clone)], cwd=scratch,
                               log=logs / "clone-git.log", timeout_s=120.0)  # fmt: skip
        if "error" in cloned or cloned["returncode"] != 0:
            return {"elapsed_s": None, "error": f"git clone failed (log: {cloned['log']})"}
        env = {k: v for k, v in cold_env().items() if not k.startswith("VIRTUAL_ENV")}
        remaining = timeout_s - (time.monotonic() - began)
        made = timed_command(["make", "parity"], cwd=clone, log=logs / "clone-make-parity.log",
                             timeout_s=remaining, env=env)  # fmt: skip
        made["elapsed_s"] = round(time.monotonic() - began, 1)
        if made["returncode"] != 0 and "error" not in made:
            made["error"] = f"make parity exited {made['returncode']} (log: {made['log']})"
        if "error" in made:
            made["elapsed_s"] = None
        return made
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
