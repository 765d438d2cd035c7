"""Harness hygiene: nothing the harness starts outlives it, its temp folders go
with it, and concurrent pools never share a port.

- A driver (``ServerPool`` + ``run_requests`` against an engine server, in a subprocess of its
  own process group) is interrupted mid-request with SIGINT (Ctrl-C) or SIGTERM: it exits
  promptly, every process it started (tracked with psutil before the signal: descendants and
  the members of their process groups) is gone, and the pool's temp folder is removed.
- ``parity run --tier serve`` is interrupted the same way.
- Two pools starting engine servers at once get distinct ports and both serve; a port taken by
  another pool's server is detected (``ServerPool`` checks that the port it polls belongs to its
  own process group) and the start is retried on a fresh port.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest

import parity.serve.launch as launch_module
import parity.serve.pool as pool_module
from parity.serve import ServerConfig, ServerHandle, ServerPool
from parity.serve.pool import group_members
from parity.server_temp import torch_cache_name

pytestmark = [pytest.mark.server]

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 240.0
EXIT_BOUND_S = 30.0  # SIGTERM + grace of each server + interpreter exit, on a busy machine
GONE_BOUND_S = 10.0

DRIVER = """
import sys
from parity.serve import ServerConfig, ServeLimits, ServerPool, ServeRequestSpec, run_requests

config = ServerConfig(
    model=sys.argv[1], engine_args={"block_size": 16, "max_model_len": 4096},
    served_model_name="scripted",
)
request = ServeRequestSpec(
    id="long", prompt_token_ids=(389, 488), max_tokens=4000, stream=True,
    body={"ignore_eos": True, "temperature": 0.0},
)
with ServerPool(grace_s=5.0) as pool:
    handle = pool.get("engine", config, startup_timeout_s=240.0)
    assert handle.startup.started, handle.startup.describe()
    print("READY", pool.log_dir, flush=True)
    while True:  # until interrupted
        run_requests(pool, "engine", config, [request], ServeLimits(request_timeout_s=600.0))
"""

SCENARIO = """\
id: long-serve
description: one long streaming request, interrupted by the test
tier: serve
config: {block_size: 16, max_model_len: 4096}
requests:
  - id: long
    prompt_token_ids: [389, 488]
    max_tokens: 4000
    ignore_eos: true
    stream: true
limits: {request_timeout_s: 600, startup_timeout_s: 240}
"""


def _tracked(root: psutil.Process) -> set[psutil.Process]:
    """``root``'s descendants and every member of their process groups."""
    found = set(root.children(recursive=True))
    groups = set()
    for proc in found:
        try:
            groups.add(os.getpgid(proc.pid))
        except ProcessLookupError:
            continue
    groups.discard(os.getpgid(root.pid))
    for group in groups:
        for pid in group_members(group):
            try:
                found.add(psutil.Process(pid))
            except psutil.NoSuchProcess:
                continue
    return found


def _alive(procs: set[psutil.Process]) -> list[str]:
    left = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            continue
    return left


def _engine_listening(root: psutil.Process) -> bool:
    """A descendant of ``root`` runs ``engine serve`` and listens on a TCP port."""
    for proc in root.children(recursive=True):
        try:
            if "engine" in proc.cmdline() and any(
                c.status == psutil.CONN_LISTEN for c in proc.net_connections(kind="tcp")
            ):
                return True
        except psutil.Error:
            continue
    return False


def _default_sigint() -> None:
    """In the child before exec: SIGINT at its default disposition, as at a terminal. A test
    session started in the background without job control (``cmd &`` in a script, as a CI
    runner may) ignores SIGINT, and an ignored signal stays ignored across exec, so Python
    would not install its KeyboardInterrupt handler and the Ctrl-C below would do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _spawn(argv: list[str], tmp: Path, cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        process_group=0,
        preexec_fn=_default_sigint,
    )


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """The driver's temp folder: short enough that each server gets a folder of its own in it
    (a socket path has at most 107 bytes; one under pytest's tmp_path would not fit)."""
    with tempfile.TemporaryDirectory(prefix="hy-", ignore_cleanup_errors=True) as folder:
        yield Path(folder)


@dataclass
class Reaper:
    """What a test started (drivers) and saw (their servers), killed at the end regardless."""

    started: list[subprocess.Popen[str]] = field(default_factory=list)
    seen: set[psutil.Process] = field(default_factory=set)

    def append(self, proc: subprocess.Popen[str]) -> None:
        self.started.append(proc)


@pytest.fixture
def reaper() -> Iterator[Reaper]:
    """Drivers a test started and the servers it saw: their groups are killed at the end
    whatever happened (a failing test must not leak what it found leaking)."""
    found = Reaper()
    yield found
    for proc in found.seen:
        try:
            os.killpg(os.getpgid(proc.pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    for proc in found.started:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                continue
            break


def _wait_ready(proc: subprocess.Popen[str], ready: threading.Event, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready.is_set():
        assert proc.poll() is None, f"exited early with {proc.returncode}"
        assert time.monotonic() < deadline, "not ready in time"
        time.sleep(0.2)


def _interrupt_and_check(
    proc: subprocess.Popen[str], sig: signal.Signals, tmp: Path, reaper: Reaper
) -> tuple[int, str, float]:
    """Signal the driver's group (Ctrl-C reaches the foreground group); assert a prompt exit,
    no survivor, no temp folder left but torch's shared cache (parity/server_temp.py)."""
    root = psutil.Process(proc.pid)
    tracked = _tracked(root)
    reaper.seen |= tracked
    assert tracked, "no server process found under the driver"
    own = [p.name for p in tmp.iterdir() if p.name.startswith("parity-tmp-")]
    assert own, f"the servers have no temp folder of their own in {tmp}"
    time.sleep(1.0)  # mid-request
    began = time.monotonic()
    os.killpg(proc.pid, sig)
    try:
        out, err = proc.communicate(timeout=EXIT_BOUND_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"did not exit within {EXIT_BOUND_S} s of {sig.name}")
    exit_s = time.monotonic() - began
    deadline = time.monotonic() + GONE_BOUND_S
    while _alive(tracked) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(tracked), f"left running after {sig.name}: {_alive(tracked)}"
    leftovers = sorted(p.name for p in tmp.iterdir() if p.name != torch_cache_name(os.environ))
    assert not leftovers, f"temp folders left in {tmp}: {leftovers}"
    print(f"{sig.name}: exit {proc.returncode} after {exit_s:.1f} s, {len(tracked)} reaped")
    return proc.returncode, out + err, exit_s


@pytest.mark.timeout(400)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_interrupted_driver_leaves_nothing(
    tmp_path: Path,
    short_tmp: Path,
    scripted_model_dir: Path,
    reaper: Reaper,
    sig: signal.Signals,
) -> None:
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(DRIVER), encoding="utf-8")
    tmp = short_tmp
    proc = _spawn([sys.executable, str(script), str(scripted_model_dir)], tmp, tmp_path)
    reaper.append(proc)
    ready = threading.Event()
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("READY"):
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    _wait_ready(proc, ready, READY_TIMEOUT_S)
    log_dir = Path(lines[0].split()[1])
    assert log_dir.parent == tmp and log_dir.is_dir()
    code, _, _ = _interrupt_and_check(proc, sig, tmp, reaper)
    assert code != 0
    if sig is signal.SIGTERM:
        assert code == -signal.SIGTERM  # it still dies of SIGTERM, after reaping


@pytest.mark.timeout(400)
def test_interrupted_parity_run_leaves_nothing(
    tmp_path: Path, short_tmp: Path, reaper: Reaper
) -> None:
    scenario = tmp_path / "long-serve.yaml"
    scenario.write_text(SCENARIO, encoding="utf-8")
    tmp = short_tmp
    argv = [sys.executable, "-m", "parity.cli", "run", str(scenario), "--tier", "serve"]
    proc = _spawn([*argv, "--target", "engine", "--no-progress"], tmp, tmp_path)
    reaper.append(proc)
    root = psutil.Process(proc.pid)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not _engine_listening(root):
        assert proc.poll() is None, f"parity run exited early: {proc.communicate()}"
        assert time.monotonic() < deadline, "the engine server did not come up"
        time.sleep(0.3)
    time.sleep(2.0)  # health wait done, the request under way
    code, output, _ = _interrupt_and_check(proc, signal.SIGINT, tmp, reaper)
    assert code != 0, output


# --- ports ---------------------------------------------------------------------------------


def _config(model_dir: Path, seed: int) -> ServerConfig:
    return ServerConfig(
        model=str(model_dir),
        engine_args={"block_size": 16, "max_model_len": 256, "seed": seed},
        served_model_name="scripted",
        extra_args=("--disable-uvicorn-access-log",),
    )


def _complete(handle: ServerHandle) -> list[int]:
    body = {
        "model": "scripted",
        "prompt": [389, 430],
        "max_tokens": 4,
        "temperature": 0.0,
        "return_token_ids": True,
    }
    response = httpx.post(f"{handle.url}/v1/completions", json=body, timeout=60.0)
    assert response.status_code == 200, response.text
    return list(response.json()["choices"][0]["token_ids"])


def _close_and_check(pools: list[ServerPool]) -> None:
    groups = [h.process.pid for p in pools for h in p.handles if h.process and not h.leased]
    for pool in pools:
        pool.close()
    left = [pid for group in groups for pid in group_members(group)]
    assert not left, f"server processes left running: {left}"


@pytest.mark.timeout(400)
def test_concurrent_pools_get_distinct_ports(tmp_path: Path, scripted_model_dir: Path) -> None:
    pools = [ServerPool(tmp_path / f"pool-{k}", grace_s=10.0) for k in range(2)]
    handles: dict[int, ServerHandle] = {}
    errors: list[BaseException] = []

    def start(k: int) -> None:
        try:
            handles[k] = pools[k].get(
                "engine", _config(scripted_model_dir, k), startup_timeout_s=240
            )
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(k,)) for k in range(2)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        assert not errors, errors
        assert all(h.startup.started for h in handles.values()), [
            h.startup.describe() for h in handles.values()
        ]
        ports = {h.startup.port for h in handles.values()}
        assert len(ports) == 2, ports
        outputs = [_complete(handles[k]) for k in range(2)]
        assert outputs[0] == outputs[1] and outputs[0]
        for k, handle in handles.items():  # each port is served by its own pool's process
            assert pool_module.listens_in_group(handle.process.pid, handle.startup.port), k
    finally:
        _close_and_check(pools)


@pytest.mark.timeout(400)
def test_a_port_taken_by_another_pool_is_not_mistaken_for_ours(
    tmp_path: Path, scripted_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second pool is handed the first pool's port (a free_port race made certain): its
    own server cannot bind, yet /health answers 200 there. The pool must notice that the
    answer comes from another process group and start again on a fresh port."""
    first, second = ServerPool(tmp_path / "a", grace_s=10.0), ServerPool(tmp_path / "b")
    try:
        handle_a = first.get("engine", _config(scripted_model_dir, 0), startup_timeout_s=240)
        assert handle_a.startup.started, handle_a.startup.describe()
        ports = iter([handle_a.startup.port])
        real_free_port = launch_module.free_port
        monkeypatch.setattr(
            launch_module, "free_port", lambda: next(ports, None) or real_free_port()
        )
        handle_b = second.get("engine", _config(scripted_model_dir, 1), startup_timeout_s=240)
        assert handle_b.startup.started, handle_b.startup.describe()
        assert handle_b.startup.port != handle_a.startup.port
        assert handle_b.startup.attempts == 2
        assert pool_module.listens_in_group(handle_b.process.pid, handle_b.startup.port)
        assert _complete(handle_b) == _complete(handle_a)
    finally:
        _close_and_check([first, second])
