"""Shared fixtures (the built test models) and the hypothesis profiles of the whole suite.

``make test`` builds the models into ``.cache/models`` first; when a test runs without them
(e.g. plain ``pytest`` on a fresh clone) they are built into a temporary folder instead.

Hypothesis profiles, chosen by ``HYPOTHESIS_PROFILE`` (default ``ci``; ``--hypothesis-profile``
wins when given): ``ci`` is derandomized (each test's examples follow from its own source, no
example database, no deadline), so a red run is reproduced by the same command and two runs on
one commit draw the same examples; ``deep`` (``make soak``) draws fresh random examples every
run, more of them where a test does not set its own count, and keeps the example database. A
failure the soak finds becomes an explicit ``@example`` on its test, so CI keeps checking it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / ".cache" / "models"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

PROFILE_ENV = "HYPOTHESIS_PROFILE"
PROFILES = ("ci", "deep")


def _register_profiles() -> None:
    common = {"deadline": None, "print_blob": True}  # no wall-clock limits on a shared machine
    slow = [HealthCheck.too_slow]
    settings.register_profile(
        "ci", derandomize=True, database=None, suppress_health_check=slow, **common
    )
    settings.register_profile(
        "deep", derandomize=False, max_examples=1000, suppress_health_check=slow, **common
    )


_register_profiles()


def pytest_configure(config: pytest.Config) -> None:
    """Load the profile before any test module builds its ``settings`` (they inherit from it);
    in the controlling process, start the session's server broker."""
    if not hasattr(config, "workerinput"):  # the controller (or the only process)
        _start_broker(config)
    if config.getoption("hypothesis_profile", None):
        return  # hypothesis's own plugin loads the one named on the command line
    name = os.environ.get(PROFILE_ENV, "").strip() or "ci"
    if name not in PROFILES:
        raise pytest.UsageError(
            f"{PROFILE_ENV}={name!r}: not a profile (one of {', '.join(PROFILES)})"
        )
    settings.load_profile(name)


# -- the session's server broker ------------------------------------------------------------------

BROKER_READY_S = 60.0
BROKER_STOP_S = 120.0  # it stops each server it holds (SIGTERM, grace, SIGKILL) before exiting


def _start_broker(config: pytest.Config) -> None:
    from parity.process import spawn
    from parity.serve.lease import ENV

    if os.environ.get(ENV) or os.environ.get("PARITY_TEST_BROKER", "1") == "0":
        return
    folder = Path(tempfile.mkdtemp(prefix="parity-test-broker-"))
    socket_path = folder / "broker.sock"
    argv = [sys.executable, "-m", "parity.serve.broker", "--socket", str(socket_path),
            "--log-dir", str(folder / "logs"), "--parent", str(os.getpid())]  # fmt: skip
    log = open(folder / "broker.log", "wb")  # noqa: SIM115 (closed in _stop_broker)
    proc = spawn(argv, env=os.environ, cwd=ROOT, log=log)
    deadline = time.monotonic() + BROKER_READY_S
    while not socket_path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait(timeout=10)
            raise pytest.UsageError(f"the server broker did not start: {folder / 'broker.log'}")
        time.sleep(0.05)
    os.environ[ENV] = str(socket_path)
    config.stash[_BROKER] = (proc, log, folder)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop the session's broker (it stops its servers first), bounded; then its group."""
    found = config.stash.get(_BROKER, None)
    if found is None:
        return
    from parity.process import signal_group
    from parity.serve.lease import ENV

    proc, log, folder = found
    os.environ.pop(ENV, None)
    signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=BROKER_STOP_S)
    except subprocess.TimeoutExpired:
        signal_group(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    log.close()
    shutil.rmtree(folder, ignore_errors=True)


_BROKER = pytest.StashKey[tuple]()


def _broker_line(config: pytest.Config) -> str | None:
    """How much the session's broker lent: servers started, leases granted."""
    if config.stash.get(_BROKER, None) is None:
        return None
    from parity.serve.lease import BrokerClient, BrokerError

    try:
        status = BrokerClient(os.environ.get("PARITY_SERVER_BROKER", "")).status()
    except BrokerError as exc:
        return f"server broker: no status ({exc})"
    labels = sorted({s["label"] for s in status["servers"]})
    lines = [
        f"server broker: {status['started']} server(s) started, {status['lent']} lease(s) "
        f"granted ({', '.join(labels) or 'none held now'})"
    ]
    for name, counts in sorted(status.get("tally", {}).items()):
        told = ", ".join(f"{event} {n}" for event, n in sorted(counts.items()))
        command = status.get("recipes", {}).get(name, "")
        flags = command[command.find(" --") + 1 :] if " --" in command else command
        lines.append(f"  {name}: {told}: {flags[:150]}")
    return "\n".join(lines)


def _model_dir(variant: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = MODELS / variant
    if (built / "model.safetensors").exists():
        return built
    from contract.scripted.builder import build

    out = tmp_path_factory.mktemp(f"model-{variant}")
    build(variant, out)
    return out


@pytest.fixture(scope="session")
def scripted_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scripted model folder (greedy output known in advance: contract.scripted.script)."""
    return _model_dir("scripted", tmp_path_factory)


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The random-weights variant (same architecture and tokenizer)."""
    return _model_dir("random", tmp_path_factory)


# -- order: the long files first ------------------------------------------------------------------


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files marked ``long`` (a whole suite, a fresh install: minutes each) first, the rest in
    their usual order. ``make test`` runs the files on two workers (``-n 2 --dist loadfile``),
    each file whole on one worker; started first, the long files run beside the short ones
    instead of after them."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)  # stable


# -- the time report: the ten slowest tests and the time per test folder ------------------------

_TIMES: dict[str, float] = {}
_BEGAN = time.monotonic()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Sum setup, call and teardown per test (a module-scoped server counts in its first test)."""
    _TIMES[report.nodeid] = _TIMES.get(report.nodeid, 0.0) + report.duration


def _folder(nodeid: str) -> str:
    return nodeid.split("::", 1)[0].rsplit("/", 1)[0]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Where the suite's time went: printed at the end of every run that timed a test."""
    if not _TIMES:
        return
    write = terminalreporter.write_line
    terminalreporter.section("time per test folder")
    folders: dict[str, list[float]] = {}
    for nodeid, took in _TIMES.items():
        folders.setdefault(_folder(nodeid), []).append(took)
    for folder, times in sorted(folders.items(), key=lambda kv: -sum(kv[1])):
        write(f"{sum(times):8.1f} s  {len(times):5d} tests  {folder}")
    write(f"{sum(_TIMES.values()):8.1f} s  {len(_TIMES):5d} tests  (sum)")
    broker = _broker_line(terminalreporter.config)
    for line in (broker or "").splitlines():
        write(line)
    if os.environ.get("PARITY_TEST_TIMES"):  # every test's time, for a closer look
        Path(os.environ["PARITY_TEST_TIMES"]).write_text(json.dumps(_TIMES, indent=1))
    workers = getattr(terminalreporter.config.option, "numprocesses", None) or 1
    write(f"{time.monotonic() - _BEGAN:8.1f} s  wall time ({workers} worker(s))")
    if sum(_TIMES.values()) > 60:  # a run long enough to be compared with another day's
        from parity.machine import load_now, machine_speed

        write(f"machine at the end: {machine_speed().describe()}; {load_now().describe()}")
    terminalreporter.section("ten slowest tests")
    for nodeid, took in sorted(_TIMES.items(), key=lambda kv: -kv[1])[:10]:
        write(f"{took:8.1f} s  {nodeid}")
