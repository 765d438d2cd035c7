"""Start each distinct serve-tier server once per run, reuse it, and reap it with a record.

``prestart(target, config)`` starts a server in the background (at most
``max_parallel_starts``, the CPU count, at once; never a second copy of a key), and the next
``get`` for it adopts it, waiting for the start within its bound.

``ServerPool.get(target, config)`` starts ``target`` with ``config`` the first time that
(target, flags) pair is asked for and returns the same ``ServerHandle`` afterwards; a refusal or
a startup timeout is cached too (the same config is not retried every scenario). A server that
died since (``crashed``) is replaced by a fresh one on the next ``get``, so a run continues with
the next scenario. ``close`` stops every server (SIGTERM, grace, SIGKILL of the whole process
group through ``parity.process.ManagedProcess``) and keeps each ``StopRecord``.

Startup outcomes: ``started``; ``startup_refused`` (the process exited before ``/health``
answered: the key line of its log, e.g. upstream's ``ValueError: To serve at least one request
with the model's max seq len (2048) ... the estimated maximum model length is 48``, from
``vllm/v1/core/kv_cache_utils.py:1003-1041`` at the pin); ``startup_timeout`` (still not
healthy after ``startup_timeout_s``: stopped, never waited on without a bound).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from parity._codec import JsonMixin
from parity.machine import LoadSample, load_now
from parity.process import (
    ManagedProcess,
    StartupError,
    StopRecord,
    forget_at_exit,
    free_port,
    remove_at_exit,
)
from parity.serve.spec import DEFAULT_STARTUP_TIMEOUT_S, ServerConfig
from parity.serve.targets import (
    ADDRESS_IN_USE,
    HOST,
    TargetSpec,
    harness_args_taken,
    parse_target,
    server_argv,
    server_cwd,
    server_env,
    startup_error_line,
    startup_numbers,
)

STARTUP_OUTCOMES = ("started", "startup_refused", "startup_timeout")
PORT_ATTEMPTS = 3
LOG_TAIL_BYTES = 8000
GROUP_EXIT_WAIT_S = 10.0
PORT_TAKEN = "answered /health from another process group"
PENDING_SLACK_S = 30.0  # beyond a start's own bound: its probe and bookkeeping


def _result(future: Future[ServerHandle], timeout: float) -> ServerHandle:
    """A background start's handle (its exception re-raised: a harness bug), bounded."""
    try:
        return future.result(timeout=timeout)
    except FuturesTimeout:
        raise TimeoutError(f"a server start did not end within {timeout:g} s") from None


@dataclass(frozen=True, slots=True)
class StartupRecord(JsonMixin):
    """How a server's startup ended."""

    target: str  # the target's label
    outcome: str  # one of STARTUP_OUTCOMES
    error: str | None = None  # the key line of the log (refused / timeout)
    numbers: dict[str, int] = field(default_factory=dict)  # e.g. estimated_max_model_len
    startup_s: float = 0.0
    returncode: int | None = None
    argv: tuple[str, ...] = ()
    port: int | None = None
    attempts: int = 1
    log_tail: str = ""
    # the harness's own keys this target was given (served_model_name, dtype, ...): a fact
    # the other target was not asked to match is not compared (parity.serve.differ)
    took: tuple[str, ...] = ()
    load: LoadSample | None = None  # the machine's load when the start ended

    @property
    def started(self) -> bool:
        return self.outcome == "started"

    def describe(self) -> str:
        if self.started:
            return f"{self.target}: started in {self.startup_s:.1f} s on port {self.port}"
        return f"{self.target}: {self.outcome}: {self.error}"


class ServerHandle:
    """One server of the pool: its startup record, URL, process and (once stopped) stop record."""

    def __init__(
        self,
        target: TargetSpec,
        config: ServerConfig,
        startup: StartupRecord,
        process: ManagedProcess | None,
    ) -> None:
        self.target = target
        self.config = config
        self.startup = startup
        self.process = process
        self.stop_record: StopRecord | None = None
        # what the server accepts, declared or probed once after it started (probe.py)
        self.capabilities: dict[str, bool] = {}
        self.final_log_tail: str | None = None
        self.leftover_pids: tuple[int, ...] = ()  # group members still alive after stop

    @property
    def label(self) -> str:
        return self.target.label

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.startup.port}"

    @property
    def model_name(self) -> str:
        return self.config.model_name

    @property
    def log_path(self) -> Path | None:
        return None if self.process is None else self.process.log_path

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def log_tail(self, max_bytes: int = LOG_TAIL_BYTES) -> str:
        if self.process is None or self.final_log_tail is not None:
            return (self.final_log_tail or self.startup.log_tail)[-max_bytes:]
        return self.process.log_tail(max_bytes)

    def stop(
        self,
        grace_s: float = 10.0,
        *,
        extension_s: float = 0.0,
        shutting_down: Callable[[], bool] | None = None,
    ) -> StopRecord | None:
        """SIGTERM the group, wait ``grace_s`` (``extension_s`` more while ``shutting_down()``:
        ``ManagedProcess.stop``), SIGKILL; idempotent. None if never spawned.

        Also waits (bounded) until every member of the group is gone: a killed worker holding
        gigabytes can take a moment to exit after its leader has been reaped."""
        if self.process is None:
            return None
        if self.stop_record is None:
            self.stop_record = self.process.stop(
                grace_s=grace_s, extension_s=extension_s, shutting_down=shutting_down
            )
            self.final_log_tail = self.process.log_tail(LOG_TAIL_BYTES)
        self.leftover_pids = wait_group_gone(self.process.pid, GROUP_EXIT_WAIT_S)
        return self.stop_record


class ServerPool:
    """Servers of one run, keyed by (target, argv without the port)."""

    def __init__(self, log_dir: str | Path | None = None, *, grace_s: float = 10.0) -> None:
        self._own_dir = log_dir is None
        self.log_dir = Path(
            tempfile.mkdtemp(prefix="parity-serve-") if log_dir is None else log_dir
        )
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self._own_dir:
            remove_at_exit(self.log_dir)  # even when ``close`` is never reached
        self.grace_s = grace_s
        self._handles: dict[tuple[str, tuple[str, ...]], ServerHandle] = {}
        self.retired: list[ServerHandle] = []  # crashed servers replaced by a new start
        self._count = 0
        self._probed: dict[str, dict[str, bool]] = {}  # target label -> probed capabilities
        self.closed = False
        # servers being started ahead of need (``prestart``), by key; one copy per key ever
        self._pending: dict[tuple[str, tuple[str, ...]], Future[ServerHandle]] = {}
        self._claimed: set[tuple[str, tuple[str, ...]]] = set()  # being started by ``get``
        self._lock = threading.RLock()
        self._executor: ThreadPoolExecutor | None = None
        self.max_parallel_starts = max(1, os.cpu_count() or 1)

    def __enter__(self) -> ServerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def handles(self) -> list[ServerHandle]:
        return [*self.retired, *self._handles.values()]

    def get(
        self,
        target: str | TargetSpec,
        config: ServerConfig,
        *,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        fresh: bool = False,
    ) -> ServerHandle:
        """The server for (target, config): started now, or the one started earlier
        (``fresh``: a new one in any case, the earlier one stopped and kept in ``retired``)."""
        if self.closed:
            raise RuntimeError("ServerPool is closed")
        spec = parse_target(target) if isinstance(target, str) else target
        key = self.key(spec, config)
        timeout = spec.serve.startup_timeout_s or startup_timeout_s
        with self._lock:
            pending = self._pending.get(key)
        if pending is not None:  # started ahead of need: wait for it (bounded like a start)
            started = _result(pending, timeout + PENDING_SLACK_S)
            with self._lock:  # still pending until adopted: prestart sees one or the other
                self._pending.pop(key, None)
                self._adopt(key, started)
        with self._lock:
            handle = self._handles.get(key)
            if handle is not None and not fresh and (not handle.startup.started or handle.alive()):
                return handle
            self._claimed.add(key)  # started here, now: prestart leaves it alone
        new: ServerHandle | None = None
        try:
            if handle is not None:  # it died since it started (or must be fresh): a new one
                handle.stop(grace_s=0.5 if not fresh else self.grace_s)
                self.retired.append(handle)
            new = self._start_probed(spec, config, timeout)
        finally:
            with self._lock:
                self._claimed.discard(key)
                if new is not None:
                    self._adopt(key, new)
        return new

    def prestart(
        self,
        target: TargetSpec,
        config: ServerConfig,
        *,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
    ) -> None:
        """Start (target, config) in the background so a later ``get`` finds it ready; a
        no-op when that server was started before (up, refused or stopped since: replacing
        one is ``get``'s job) or is starting (never two copies of a config).
        At most ``max_parallel_starts`` starts run at once."""
        key = self.key(target, config)
        timeout = target.serve.startup_timeout_s or startup_timeout_s
        with self._lock:
            if self.closed or key in self._pending or key in self._claimed or key in self._handles:
                return
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=self.max_parallel_starts, thread_name_prefix="parity-prestart"
                )
            self._pending[key] = self._executor.submit(self._start_probed, target, config, timeout)

    def starting(self) -> int:
        """How many servers are being started ahead of need."""
        with self._lock:
            return sum(not f.done() for f in self._pending.values())

    def _start_probed(self, spec: TargetSpec, config: ServerConfig, timeout: float) -> ServerHandle:
        handle = self._start(spec, config, timeout)
        if handle.startup.started:
            from parity.serve.probe import capabilities

            with self._lock:
                probed = self._probed
            handle.capabilities = capabilities(handle, probed)
        return handle

    def _adopt(self, key: tuple[str, tuple[str, ...]], handle: ServerHandle) -> None:
        with self._lock:
            old = self._handles.get(key)
            if old is not None and old is not handle:
                old.stop(grace_s=0.5)
                self.retired.append(old)
            self._handles[key] = handle

    @staticmethod
    def key(spec: TargetSpec, config: ServerConfig) -> tuple[str, tuple[str, ...]]:
        """Servers of equal keys are one server (port 0: the same config gives the same key)."""
        return (spec.label, tuple(server_argv(spec, config, 0)))

    def stop(self, handle: ServerHandle, grace_s: float | None = None) -> StopRecord | None:
        """Stop one server now (e.g. a SIGTERM leg); it is replaced on the next ``get``."""
        return handle.stop(self.grace_s if grace_s is None else grace_s)

    def close(self) -> list[tuple[str, StopRecord]]:
        """Stop every server (those still starting ahead of need too, once their start ends:
        bounded by their startup timeout); return (label, stop record) pairs. Removes an own
        temp log dir."""
        with self._lock:
            self.closed = True
            pending, self._pending = list(self._pending.items()), {}
        for key, future in pending:
            future.cancel()
            if not future.cancelled():
                try:
                    self._adopt(key, _result(future, DEFAULT_STARTUP_TIMEOUT_S + PENDING_SLACK_S))
                except TimeoutError:
                    pass
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        records: list[tuple[str, StopRecord]] = []
        for handle in self.handles:
            record = handle.stop(self.grace_s)
            if record is not None:
                records.append((handle.label, record))
        self.closed = True
        if self._own_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)
            forget_at_exit(self.log_dir)
        return records

    def _start(self, spec: TargetSpec, config: ServerConfig, timeout_s: float) -> ServerHandle:
        for attempt in range(1, PORT_ATTEMPTS + 1):
            handle = self._start_once(spec, config, timeout_s, attempt)
            in_use = any(m in handle.startup.log_tail for m in ADDRESS_IN_USE)
            in_use = in_use or PORT_TAKEN in (handle.startup.error or "")
            if handle.startup.outcome != "startup_refused" or not in_use:
                return handle
        return handle

    def _start_once(
        self, spec: TargetSpec, config: ServerConfig, timeout_s: float, attempt: int
    ) -> ServerHandle:
        port = free_port()
        argv = server_argv(spec, config, port)
        with self._lock:
            self._count += 1
            count = self._count
        log = self.log_dir / f"{count:02d}-{_slug(spec.label)}.log"
        began = time.monotonic()
        record = dict(
            target=spec.label,
            argv=tuple(argv),
            port=port,
            attempts=attempt,
            took=harness_args_taken(spec, config),
            load=load_now(),
        )
        try:
            process = ManagedProcess(
                argv, log_path=log, env=server_env(spec), cwd=server_cwd(spec, config)
            )
        except StartupError as exc:  # the command could not be run at all
            startup = StartupRecord(
                outcome="startup_refused", error=str(exc),
                startup_s=round(time.monotonic() - began, 3), **record,  # type: ignore[arg-type]
            )  # fmt: skip
            return ServerHandle(spec, config, startup, None)
        try:
            elapsed = process.wait_healthy(f"http://{HOST}:{port}{spec.serve.health}", timeout_s)
        except StartupError as exc:
            timed_out = exc.returncode is None and process.alive()
            process.stop(grace_s=min(self.grace_s, 5.0))
            tail = process.log_tail(LOG_TAIL_BYTES)
            full = _read(log)
            startup = StartupRecord(
                outcome="startup_timeout" if timed_out else "startup_refused",
                error=str(exc) if timed_out else (startup_error_line(full) or str(exc)),
                numbers=startup_numbers(full),
                startup_s=round(time.monotonic() - began, 3),
                returncode=process.proc.returncode,
                log_tail=tail,
                **record,  # type: ignore[arg-type]
            )
            handle = ServerHandle(spec, config, startup, process)
            handle.stop()  # already stopped: records it and waits for the group to be gone
            return handle
        if spec.serve.port_in_group and not listens_in_group(process.pid, port):
            # free_port() raced with another pool: /health was answered by someone else's
            # server on this port. Ours never bound it; stop it and let _start retry.
            process.stop(grace_s=min(self.grace_s, 5.0))
            startup = StartupRecord(
                outcome="startup_refused",
                error=f"port {port} {PORT_TAKEN}",
                startup_s=round(time.monotonic() - began, 3),
                returncode=process.proc.returncode,
                log_tail=process.log_tail(LOG_TAIL_BYTES),
                **record,  # type: ignore[arg-type]
            )
            handle = ServerHandle(spec, config, startup, process)
            handle.stop()
            return handle
        startup = StartupRecord(
            outcome="started",
            numbers=startup_numbers(_read(log)),
            startup_s=round(elapsed, 3),
            **record,  # type: ignore[arg-type]
        )
        return ServerHandle(spec, config, startup, process)


def listens_in_group(pgid: int, port: int) -> bool:
    """A live member of process group ``pgid`` listens on TCP ``port``."""
    for pid in group_members(pgid):
        try:
            connections = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.Error:
            continue
        if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in connections):
            return True
    return False


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group ``pgid``."""
    members: list[int] = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                members.append(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def wait_group_gone(pgid: int, timeout_s: float) -> tuple[int, ...]:
    """SIGKILL what is left of the group and wait until it is gone; return any survivors."""
    deadline = time.monotonic() + timeout_s
    while True:
        members = group_members(pgid)
        if not members or time.monotonic() >= deadline:
            return tuple(members)
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        time.sleep(0.05)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:60].strip("_") or "server"


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
