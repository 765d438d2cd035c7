"""Server subprocesses the harness starts: launch, bounded health wait, reap the whole group.

Every process is started in the caller's session with a new process group (``process_group=0``),
never a new session (on 2-core machines a new session starves vLLM's API server:
docs/oracle-on-cpu.md), and is reaped with ``os.killpg``: SIGTERM, a grace period, then SIGKILL.
``stop`` records whether SIGTERM sufficed and how long the exit took, because a server that survives
SIGTERM is a finding (docs/failure-classes.md: the port's wedged server outlived SIGTERM by 53
minutes).

Each ``ManagedProcess`` gets a temp folder of its own (``parity.server_temp``: the pinned vLLM
leaves its IPC sockets and a rendezvous file in the temp folder, even after a clean SIGTERM),
removed once its group is reaped.

Nothing started here outlives the harness: Ctrl-C (SIGINT, ``KeyboardInterrupt``) unwinds
through the callers' ``with`` blocks, then an ``atexit`` hook reaps whatever is still
registered and removes the folders given to ``remove_at_exit``. SIGTERM's default action would
end the interpreter without any of that, so a handler does the same reaping and then dies of
SIGTERM as before. Python lets only the main thread install one, so it is installed by the
first ``ManagedProcess`` started in the main thread, or up front by ``reap_on_sigterm`` (the
server pool calls it, because it starts servers ahead of need from worker threads, whose
processes the handler must reap too). From the moment the reaping begins nothing new is
started (``spawn`` raises ``HarnessStopping``), and a group spawned just before, whose owner
had not registered it yet, is reaped from ``spawn``'s own record.

The handler runs only in the main thread, between two bytecodes, while the kernel may hand
SIGTERM to any thread that does not block it: then a main thread blocked in one long call (a
lock, a socket read, a ``select``) runs the handler only when that call returns. Seen: beside a
thread spawning processes, 2 of about 120 SIGTERMs waited out a 600 s sleep of the main thread.
So the harness's waits that can be long (a server started ahead of need, a broker's lease, a
scheduler worker's answer) are cut into ``slices`` of at most ``MAIN_WAIT_SLICE_S``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

import httpx

from parity.server_temp import private_temp, server_env


class Stoppable(Protocol):
    """Anything that reaps its own process group (``ManagedProcess``, a protocol worker)."""

    def stop(self, grace_s: float = 10.0) -> Any: ...


MAIN_WAIT_SLICE_S = 0.25  # the longest one blocking call of a harness wait (module docstring)


def slices(timeout_s: float) -> Iterator[float]:
    """``timeout_s`` as a run of waits of at most ``MAIN_WAIT_SLICE_S`` each (what is left of
    it, capped), so that a signal handler runs between two of them; none once it is spent."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        yield min(MAIN_WAIT_SLICE_S, left)


_LIVE: set[Stoppable] = set()
_TEMP_DIRS: set[Path] = set()
# Every group ``spawn`` started whose leader is not yet known to be reaped, by leader pid, and
# whether the harness is being stopped; both under ``_SPAWN_LOCK``, which ``spawn`` holds from
# its check to its record, so the reaper sees every group started before it began. Reentrant:
# the SIGTERM handler runs in the main thread, possibly while that thread is inside ``spawn``.
_SPAWNED: dict[int, subprocess.Popen[bytes]] = {}
_SPAWN_LOCK = threading.RLock()
_STOPPING = threading.Event()


def track(process: Stoppable) -> None:
    """Reap ``process`` (``stop(grace_s=2)``) at exit or SIGTERM unless untracked before."""
    _LIVE.add(process)
    reap_on_sigterm()


def untrack(process: Stoppable) -> None:
    _LIVE.discard(process)


CANNOT_RUN = "cannot run "  # how a StartupError for a command that could not be run begins


class HarnessStopping(RuntimeError):
    """The harness is being stopped (SIGTERM or exit): nothing new is started."""


class StartupError(RuntimeError):
    """A server exited or did not become healthy within its bound."""

    def __init__(self, message: str, *, log_tail: str = "", returncode: int | None = None):
        super().__init__(message)
        self.log_tail = log_tail
        self.returncode = returncode


@dataclass(frozen=True, slots=True)
class StopRecord:
    """How a process group ended."""

    returncode: int | None
    sigterm_sufficed: bool  # exited after SIGTERM alone (within the grace or its extension)
    exit_s: float  # seconds from SIGTERM to exit (or to SIGKILL's reaping)
    already_exited: bool  # it had exited before we signalled it
    extended_s: float = 0.0  # how long past the grace period it was given (see ``stop``)


def free_port() -> int:
    """An unused TCP port on 127.0.0.1 (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None,
    cwd: str | os.PathLike[str] | None,
    log: IO[bytes] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new process group of the caller's session (never a new session: see
    the module docstring), so that ``signal_group(proc.pid, ...)`` reaches all of it.

    With ``log`` its stdin is closed and its stdout and stderr both go to ``log``; without,
    stdin, stdout and stderr are pipes. ``OSError`` when it cannot be run, ``HarnessStopping``
    once the harness has begun reaping its processes."""
    with _SPAWN_LOCK:
        if _STOPPING.is_set():
            raise HarnessStopping(f"the harness is stopping: {argv[0]!r} not started")
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL if log is not None else subprocess.PIPE,
            stdout=log if log is not None else subprocess.PIPE,
            stderr=subprocess.STDOUT if log is not None else subprocess.PIPE,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            process_group=0,
        )
        _SPAWNED[proc.pid] = proc
    return proc


def reaped(proc: subprocess.Popen[bytes]) -> None:
    """``proc``'s group has been reaped by its owner: forget ``spawn``'s record of it."""
    with _SPAWN_LOCK:
        _SPAWNED.pop(proc.pid, None)


class ManagedProcess:
    """One subprocess in its own process group, logging to a file."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log_path: str | os.PathLike[str],
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop())
        self.started_at = time.monotonic()
        base = os.environ if env is None else env
        self.temp_folder = private_temp(base)
        if self.temp_folder is not None:
            remove_at_exit(self.temp_folder)
        try:
            self.proc = spawn(
                self.argv, env=server_env(base, self.temp_folder), cwd=cwd, log=self._log
            )
        except OSError as exc:  # no such program or folder, not executable: nothing started
            self._log.close()
            self._remove_temp_folder()
            where = f" in {cwd}" if cwd is not None else ""
            raise StartupError(
                f"{CANNOT_RUN}{self.argv[0]!r}{where}: {exc.strerror or exc}"
            ) from exc
        self.stop_record: StopRecord | None = None
        track(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, max_bytes: int = 4000) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-max_bytes:].decode("utf-8", "replace")

    def wait_healthy(self, url: str, timeout_s: float, *, interval_s: float = 0.25) -> float:
        """Poll ``url`` until it answers 200; return seconds since start. Bounded by timeout_s."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if not self.alive():
                    raise StartupError(
                        f"exited with code {self.proc.returncode} before {url} answered",
                        log_tail=self.log_tail(),
                        returncode=self.proc.returncode,
                    )
                try:
                    if client.get(url).status_code == 200:
                        return time.monotonic() - self.started_at
                except httpx.HTTPError:
                    pass
                time.sleep(interval_s)
        raise StartupError(
            f"not healthy within {timeout_s:.0f} s ({url})", log_tail=self.log_tail()
        )

    def stop(
        self,
        grace_s: float = 10.0,
        *,
        extension_s: float = 0.0,
        shutting_down: Callable[[], bool] | None = None,
    ) -> StopRecord:
        """SIGTERM the group, wait up to grace_s, then SIGKILL. Idempotent.

        A process still alive at the end of the grace period for which ``shutting_down()`` says
        it is on its way out (it has stopped serving) gets up to ``extension_s`` more before
        SIGKILL: on a busy machine a server that shuts down can take longer than the grace
        period to exit, and calling that "survived SIGTERM" would accuse it of what the port's
        wedged server did (kept serving). The record says how long it was given."""
        if self.stop_record is not None:
            return self.stop_record
        already = not self.alive()
        t0 = time.monotonic()
        sufficed = True
        extended = 0.0
        if not already:
            signal_group(self.proc.pid, signal.SIGTERM)
            # a paused (SIGSTOPped) member only acts on SIGTERM once it runs again
            signal_group(self.proc.pid, signal.SIGCONT)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                sufficed = False
            if not sufficed and extension_s > 0 and shutting_down is not None and shutting_down():
                extended = extension_s
                try:
                    self.proc.wait(timeout=extension_s)
                    sufficed = True
                except subprocess.TimeoutExpired:
                    pass
        # The leader may be gone while workers of its group linger: always finish the group.
        signal_group(self.proc.pid, signal.SIGKILL)
        try:
            self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass
        self.stop_record = StopRecord(
            returncode=self.proc.returncode,
            sigterm_sufficed=sufficed,
            exit_s=time.monotonic() - t0,
            already_exited=already,
            extended_s=extended,
        )
        self._log.close()
        reaped(self.proc)
        untrack(self)
        self._remove_temp_folder()
        return self.stop_record

    def _remove_temp_folder(self) -> None:
        if self.temp_folder is not None:
            shutil.rmtree(self.temp_folder, ignore_errors=True)  # a link's target is kept
            forget_at_exit(self.temp_folder)


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """``os.killpg``, ignoring a group that is already gone."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def reap_groups(popens: Sequence[subprocess.Popen[bytes]], grace_s: float) -> None:
    """Reap each leader's whole group: SIGTERM the live ones, wait up to ``grace_s`` in all,
    then SIGKILL every group (children of an exited leader may linger) and wait for each
    leader at most 5 s more."""
    alive = [popen for popen in popens if popen.poll() is None]
    for popen in alive:
        signal_group(popen.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for popen in alive:
        try:
            popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for popen in popens:
        signal_group(popen.pid, signal.SIGKILL)
        try:
            popen.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass


def remove_at_exit(path: str | os.PathLike[str]) -> None:
    """Remove this folder when the interpreter exits or is SIGTERMed (unless forgotten)."""
    _TEMP_DIRS.add(Path(path))


def forget_at_exit(path: str | os.PathLike[str]) -> None:
    _TEMP_DIRS.discard(Path(path))


def reap_on_sigterm() -> None:
    """Reap every process started here on SIGTERM, then die of it as before. Installs the
    handler when called in the main thread while SIGTERM has its default disposition; a no-op
    otherwise (another thread cannot install one, and a caller's own handler is kept)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum: int, _frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _reap_all()
    os.kill(os.getpid(), signum)


@atexit.register
def _reap_all() -> None:
    with _SPAWN_LOCK:
        _STOPPING.set()  # nothing starts from here on
    for proc in list(_LIVE):
        proc.stop(grace_s=2.0)
    # Groups spawned whose owner had not registered them yet (a server being started from a
    # worker thread when the signal came): the same SIGTERM, grace, SIGKILL. A leader already
    # reaped is skipped, so a pid the system has since given to another process is never hit.
    with _SPAWN_LOCK:
        left = [p for p in _SPAWNED.values() if p.poll() is None]
        _SPAWNED.clear()
    reap_groups(left, grace_s=2.0)
    for folder in list(_TEMP_DIRS):
        shutil.rmtree(folder, ignore_errors=True)
        _TEMP_DIRS.discard(folder)
