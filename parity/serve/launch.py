"""Start one server process from a ``StartRecipe``: the one way the harness starts a server.

A recipe is everything that decides which server runs, as plain data: the argv (``{port}``
where the port goes), the target's own environment variables (added to the starter's
environment), the folder, the readiness path and its bound. ``ServerPool`` makes one from a
target and a server config (``recipe``) and starts it here; so does the server broker
(``parity.serve.broker``), which receives recipes over its socket. Two recipes with equal
``key`` start the same server.

``launch`` picks a free port, starts the process in its own process group
(``parity.process.ManagedProcess``), waits for ``health`` within ``timeout_s`` and returns a
``StartupRecord``: ``started``; ``startup_refused`` (the process exited before ``/health``
answered: the key line of its log, e.g. upstream's ``ValueError: To serve at least one request
with the model's max seq len (2048) ... the estimated maximum model length is 48``, from
``vllm/v1/core/kv_cache_utils.py:1003-1041`` at the pin); ``startup_timeout`` (still not
healthy after the bound: stopped, never waited on without one). A port another process took
between choosing and binding it is retried (``PORT_ATTEMPTS``).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from parity._codec import JsonMixin
from parity.machine import LoadSample, load_now
from parity.process import ManagedProcess, StartupError, free_port
from parity.serve.spec import DEFAULT_STARTUP_TIMEOUT_S, ServerConfig
from parity.serve.targets import (
    ADDRESS_IN_USE,
    HOST,
    TargetSpec,
    declared_env,
    harness_args_taken,
    server_argv,
    server_cwd,
    startup_error_line,
    startup_numbers,
)

STARTUP_OUTCOMES = ("started", "startup_refused", "startup_timeout")
PORT_ATTEMPTS = 3
LOG_TAIL_BYTES = 8000
PORT_TAKEN = "answered /health from another process group"
PORT_WORD = "{port}"  # where a recipe's argv takes the port


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
    # runs this server had served before this one leased it from a broker (0: a new server)
    reused: int = 0

    @property
    def started(self) -> bool:
        return self.outcome == "started"

    def describe(self) -> str:
        if self.started:
            again = f", leased after {self.reused} other run(s)" if self.reused else ""
            return f"{self.target}: started in {self.startup_s:.1f} s on port {self.port}{again}"
        return f"{self.target}: {self.outcome}: {self.error}"


@dataclass(frozen=True, slots=True)
class StartRecipe(JsonMixin):
    """What starts one server, as plain data (see the module docstring)."""

    label: str
    argv: tuple[str, ...]  # PORT_WORD where the port goes
    env: dict[str, str] = field(default_factory=dict)  # the target's own, expanded
    cwd: str | None = None
    health: str = "/health"
    timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
    took: tuple[str, ...] = ()
    port_in_group: bool = True  # its process group listens on the port (external: may not)
    reset: tuple[str, ...] = ()  # a broker's server: POST paths between leases (ShareDef)
    poll_s: float = 0.25  # how often the readiness path is polled (a benchmark times starts)

    @property
    def key(self) -> str:
        """Equal keys start the same server: the argv, the target's environment, the folder
        (and, for a broker, the resets that make a used server fresh)."""
        text = json.dumps([self.argv, sorted(self.env.items()), self.cwd, self.reset])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def argv_on(self, port: int) -> list[str]:
        return [word.replace(PORT_WORD, str(port)) for word in self.argv]


def recipe(spec: TargetSpec, config: ServerConfig, timeout_s: float) -> StartRecipe:
    """The recipe that starts ``spec`` with ``config``."""
    return StartRecipe(
        label=spec.label,
        argv=tuple(server_argv(spec, config, PORT_WORD)),
        env=declared_env(spec),
        cwd=server_cwd(spec, config),
        health=spec.serve.health,
        timeout_s=timeout_s,
        took=harness_args_taken(spec, config),
        port_in_group=spec.serve.port_in_group,
    )


def launch(
    start: StartRecipe,
    log_for: Callable[[], Path],
    *,
    grace_s: float = 10.0,
    extra_env: Mapping[str, str] | None = None,
    on_spawn: Callable[[ManagedProcess], None] | None = None,
) -> tuple[StartupRecord, ManagedProcess | None]:
    """Start ``start`` (a new log file from ``log_for()`` per attempt); the record, and the
    process (None when the command could not be run at all; already stopped when it did not
    start, so only its record and log are left). ``on_spawn`` is given each attempt's process
    as soon as it runs, before its health wait (a caller that stops it ends the wait)."""
    env = {**os.environ, **start.env, **(extra_env or {})}
    for attempt in range(1, PORT_ATTEMPTS + 1):
        record, process = _launch_once(start, log_for(), env, grace_s, attempt, on_spawn)
        in_use = any(m in record.log_tail for m in ADDRESS_IN_USE)
        in_use = in_use or PORT_TAKEN in (record.error or "")
        if record.outcome != "startup_refused" or not in_use:
            return record, process
        if process is not None and attempt < PORT_ATTEMPTS:  # this attempt is left behind
            wait_group_gone(process.pid, GROUP_EXIT_WAIT_S)
    return record, process


def _launch_once(
    start: StartRecipe,
    log: Path,
    env: dict[str, str],
    grace_s: float,
    attempt: int,
    on_spawn: Callable[[ManagedProcess], None] | None,
) -> tuple[StartupRecord, ManagedProcess | None]:
    port = free_port()
    argv = start.argv_on(port)
    began = time.monotonic()
    common = dict(target=start.label, argv=tuple(argv), port=port, attempts=attempt,
                  took=start.took, load=load_now())  # fmt: skip

    def ended(outcome: str, process: ManagedProcess | None, **more: object) -> StartupRecord:
        return StartupRecord(
            outcome=outcome, startup_s=round(time.monotonic() - began, 3),
            returncode=None if process is None else process.proc.returncode,
            log_tail="" if process is None else process.log_tail(LOG_TAIL_BYTES),
            **common, **more,  # type: ignore[arg-type]
        )  # fmt: skip

    try:
        process = ManagedProcess(argv, log_path=log, env=env, cwd=start.cwd)
    except StartupError as exc:  # the command could not be run at all
        return ended("startup_refused", None, error=str(exc)), None
    if on_spawn is not None:
        on_spawn(process)
    try:
        elapsed = process.wait_healthy(
            f"http://{HOST}:{port}{start.health}", start.timeout_s, interval_s=start.poll_s
        )
    except StartupError as exc:
        timed_out = exc.returncode is None and process.alive()
        process.stop(grace_s=min(grace_s, 5.0))
        full = _read(log)
        error = str(exc) if timed_out else (startup_error_line(full) or str(exc))
        outcome = "startup_timeout" if timed_out else "startup_refused"
        return ended(outcome, process, error=error, numbers=startup_numbers(full)), process
    if start.port_in_group and not listens_in_group(process.pid, port):
        # free_port() raced with another starter: /health was answered by someone else's
        # server on this port. Ours never bound it; stop it and let launch retry.
        process.stop(grace_s=min(grace_s, 5.0))
        return ended("startup_refused", process, error=f"port {port} {PORT_TAKEN}"), process
    record = StartupRecord(
        outcome="started", numbers=startup_numbers(_read(log)), startup_s=round(elapsed, 3),
        **common,  # type: ignore[arg-type]
    )  # fmt: skip
    return record, process


GROUP_EXIT_WAIT_S = 10.0


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


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
