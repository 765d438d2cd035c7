"""SIGTERM to the harness reaps every process it started (``parity/process.py``), including
the servers a ``ServerPool`` starts ahead of need from its worker threads, and the groups
spawned in the instant before the reaping began.

Each case runs a small harness in a child interpreter (its own process group), waits until
it has started its grandchildren, sends the child SIGTERM, and checks the child died of it
and that no grandchild's process group is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(90)

SLEEPER = "import time; time.sleep(600)"

# A pool made in the main thread, then a server started from another thread, as
# ``ServerPool.prestart`` does; the main thread only waits.
POOL_THREAD_START = """
import sys, threading, time
from pathlib import Path
from parity.process import ManagedProcess
from parity.serve.pool import ServerPool

folder = Path(sys.argv[1])
pool = ServerPool(folder / "logs", broker=None)

def start() -> None:
    process = ManagedProcess([sys.executable, "-c", {sleeper!r}], log_path=folder / "s.log")
    (folder / "pids").write_text(f"{{process.pid}}\\n")

threading.Thread(target=start, daemon=True).start()
time.sleep(600)
"""

# Groups spawned from a thread and never handed to an owner (the instant between ``spawn`` and
# ``track``), one every 50 ms until the signal comes.
UNTRACKED_SPAWNS = """
import sys, threading, time
from pathlib import Path
from parity.process import HarnessStopping, reap_on_sigterm, slices, spawn

folder = Path(sys.argv[1])
reap_on_sigterm()

def keep_spawning() -> None:
    with open(folder / "pids", "a") as out:
        while True:
            try:
                proc = spawn([sys.executable, "-c", {sleeper!r}], env=None, cwd=None)
            except HarnessStopping:
                (folder / "refused").write_text("yes")
                return
            out.write(f"{{proc.pid}}\\n")
            out.flush()
            time.sleep(0.05)

threading.Thread(target=keep_spawning, daemon=True).start()
for wait_s in slices(600):  # the main thread waits as the harness's waits do
    time.sleep(wait_s)
"""


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _pids(folder: Path) -> list[int]:
    path = folder / "pids"
    if not path.exists():
        return []
    return [int(line) for line in path.read_text().split()]


def _clean_up(child: subprocess.Popen[bytes], folder: Path) -> None:
    """Whatever the outcome: the harness's group and every group it recorded, SIGKILLed."""
    if child.poll() is None:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=10.0)
    for pid in _pids(folder):
        if _group_alive(pid):
            os.killpg(pid, signal.SIGKILL)


def _left_alive(folder: Path) -> tuple[list[int], list[int]]:
    """The pids the harness recorded, and those whose group is still there (after a moment for
    a group being torn down by SIGKILL)."""
    time.sleep(0.2)
    pids = _pids(folder)
    return pids, [pid for pid in pids if _group_alive(pid)]


def _sigterm_after_pids(code: str, folder: Path, at_least: int) -> tuple[int, list[int], list[int]]:
    """Run ``code`` as a harness, SIGTERM it once it has recorded ``at_least`` pids; its exit
    status, the pids, and the ones whose group outlived it."""
    child = subprocess.Popen([sys.executable, "-c", code, str(folder)], cwd=ROOT, process_group=0)
    try:
        pids: list[int] = []
        deadline = time.monotonic() + 60.0
        while len(pids) < at_least and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.05)
            pids = _pids(folder)
        assert len(pids) >= at_least, f"the harness recorded {pids} (exit {child.poll()})"
        child.send_signal(signal.SIGTERM)
        returncode = child.wait(timeout=30.0)
        return (returncode, *_left_alive(folder))
    finally:
        _clean_up(child, folder)


def test_a_server_a_pool_started_from_a_worker_thread_is_reaped_on_sigterm(
    tmp_path: Path,
) -> None:
    returncode, pids, left = _sigterm_after_pids(
        POOL_THREAD_START.format(sleeper=SLEEPER), tmp_path, at_least=1
    )
    assert returncode == -signal.SIGTERM  # it still dies of the signal, after reaping
    assert len(pids) == 1 and left == []


def test_groups_spawned_before_their_owner_registered_them_are_reaped(tmp_path: Path) -> None:
    returncode, pids, left = _sigterm_after_pids(
        UNTRACKED_SPAWNS.format(sleeper=SLEEPER), tmp_path, at_least=3
    )
    assert returncode == -signal.SIGTERM
    assert len(pids) >= 3 and left == []


# SIGTERM handed to a thread other than the main one (the kernel may pick any thread that does
# not block it; here a helper thread sends it to itself, so it is that thread every time) while
# the main thread is in one of the harness's long waits: the handler must still run within a
# slice (parity.process.slices), reap what was started and end the harness. Each program
# records the pid of the process group it started; the waits would last 300 s otherwise.
SIGNAL_ELSEWHERE = """
import os, signal, socket, sys, threading, time
from pathlib import Path
from parity.process import reap_on_sigterm

folder = Path(sys.argv[1])
reap_on_sigterm()

def signal_myself() -> None:
    group = folder / "group"  # written (whole) once the process group is started
    deadline = time.monotonic() + 60.0
    while not group.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # the main thread is waiting by now
    (folder / "pids").write_text(group.read_text())
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

threading.Thread(target=signal_myself, daemon=True).start()
{wait}
"""
WAITS = {
    # a server started ahead of need on the pool's worker thread, never healthy
    "pool": """
from parity.serve.pool import ServerPool
from parity.serve.spec import ServerConfig
from parity.serve.targets import parse_target
server = folder / "server.py"  # never healthy; its pid in the file named first, whole
server.write_text(
    "import os, sys, time\\n"
    "open(sys.argv[1] + '.t', 'w').write(str(os.getpid()))\\n"
    "os.rename(sys.argv[1] + '.t', sys.argv[1])\\n"
    "time.sleep(600)\\n"
)
spec = parse_target(f"external:{sys.executable} {server} {folder / 'group'} --port {{port}}")
config = ServerConfig(model="m", engine_args={})
with ServerPool(folder / "logs", broker=None) as pool:
    pool.prestart(spec, config, startup_timeout_s=300)
    pool.get(spec, config, startup_timeout_s=300)
""",
    # a broker that takes the lease request and never answers
    "lease": """
from parity.process import ManagedProcess
from parity.serve.launch import StartRecipe
from parity.serve.lease import BrokerClient
other = ManagedProcess([sys.executable, "-c", "import time; time.sleep(600)"],
                       log_path=folder / "other.log")
(folder / "group").write_text(str(other.pid))
path = str(folder / "b.sock")
listener = socket.socket(socket.AF_UNIX)
listener.bind(path)
listener.listen()
def hold() -> None:
    connection, _ = listener.accept()  # kept open, never answered
    time.sleep(600)
threading.Thread(target=hold, daemon=True).start()
BrokerClient(path).lease(StartRecipe(label="x", argv=("x",), timeout_s=300))
""",
    # a scheduler worker that never answers
    "worker": """
from parity.targets._pipe import WorkerProcess
worker = WorkerProcess([sys.executable, "-c", "import time; time.sleep(600)"])
(folder / "group").write_text(str(worker.proc.pid))
worker.exchange({"op": "hello"}, timeout_s=300, what="hello")
""",
}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("wait", sorted(WAITS))
def test_sigterm_taken_by_another_thread_still_ends_a_long_wait(tmp_path: Path, wait: str) -> None:
    code = SIGNAL_ELSEWHERE.replace("{wait}", WAITS[wait])
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, process_group=0)
    try:
        returncode = child.wait(timeout=90.0)  # up to 60 s for the start under load
        pids, left = _left_alive(tmp_path)
    finally:
        _clean_up(child, tmp_path)
    assert returncode == -signal.SIGTERM
    assert len(pids) == 1 and left == [], (pids, left)


# The fake server takes 4 s over a ``generate`` request: the interruption lands while it is in
# flight on the first target and the second target's server is still starting.
SCENARIO = """id: ctrl-c
description: a run interrupted while a request is in flight and a server is still starting
tier: serve
config: {block_size: 32}
limits: {startup_timeout_s: 300}
requests:
  - {id: r1, endpoint: completions, prompt: generate, max_tokens: 5}
"""


# ``parity`` as a terminal starts it, with SIGINT's default handler: a process started from a
# background job (``make test &``, ``nohup``) inherits SIGINT ignored, and Ctrl-C would then
# never reach it, by the shell's design.
AS_FROM_A_TERMINAL = (
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from parity.cli import main; sys.exit(main(sys.argv[1:]))"
)


def test_ctrl_c_mid_run_stops_its_servers_at_once_with_one_line(tmp_path: Path) -> None:
    """``parity run`` interrupted (SIGINT, what Ctrl-C sends) while a request is in flight on
    one target's server and the other's is still starting (it never becomes healthy): exit 130
    within seconds, one line instead of a traceback, and neither server's group left."""
    scenario = tmp_path / "ctrl-c.yaml"
    scenario.write_text(SCENARIO)
    fake = ROOT / "tests" / "parity" / "serve" / "fake_server.py"
    logs = tmp_path / "logs"
    pid_file = tmp_path / "never.pid"
    never_healthy = (
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    )
    argv = [
        sys.executable, "-c", AS_FROM_A_TERMINAL, "run", str(scenario), "--tier", "serve",
        "--no-progress", "--log-dir", str(logs),
        "--target", f"external:{sys.executable} {fake} --port {{port}}",
        "--target", f'external:{sys.executable} -c "{never_healthy}" --port {{port}}',
    ]  # fmt: skip
    child = subprocess.Popen(
        argv, cwd=tmp_path, process_group=0, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    never = 0
    try:
        deadline = time.monotonic() + 60.0
        while not pid_file.exists() and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.05)
        assert pid_file.exists(), "the second server should have been started"
        time.sleep(1.5)  # the first server up and the request sent
        never = int(pid_file.read_text())
        began = time.monotonic()
        child.send_signal(signal.SIGINT)
        _out, err = child.communicate(timeout=60.0)
        took = time.monotonic() - began
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(timeout=10.0)
        if never and _group_alive(never):
            os.killpg(never, signal.SIGKILL)
    text = err.decode("utf-8", "replace")
    assert child.returncode == 130, text
    assert took < 20.0, f"the interrupted run took {took:.1f} s to stop"
    assert "interrupted" in text and "Traceback" not in text, text
    assert not _group_alive(never)


# SIGTERM arriving while the main thread is itself inside ``spawn`` (it holds spawn's lock):
# the handler, which runs in that same thread, must still reap and die, not wait on the lock.
SIGTERM_INSIDE_SPAWN = """
import os, signal, sys, time
from pathlib import Path
import parity.process as process

folder = Path(sys.argv[1])
process.reap_on_sigterm()
sleeper = process.ManagedProcess([sys.executable, "-c", {sleeper!r}], log_path=folder / "s.log")
(folder / "pids").write_text(f"{{sleeper.pid}}\\n")
with process._SPAWN_LOCK:  # as spawn holds it around Popen
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
"""


def test_sigterm_while_the_main_thread_is_spawning_still_reaps(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", SIGTERM_INSIDE_SPAWN.format(sleeper=SLEEPER), str(tmp_path)],
        cwd=ROOT,
        process_group=0,
    )
    try:
        returncode = child.wait(timeout=20.0)
        pids, left = _left_alive(tmp_path)
    finally:
        _clean_up(child, tmp_path)
    assert returncode == -signal.SIGTERM
    assert len(pids) == 1 and left == []
