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

How a server starts and the startup outcomes: ``parity.serve.launch``. With a server broker
(``PARITY_SERVER_BROKER``, ``parity.serve.broker``), a target that declares ``share`` is leased
from the broker instead of started, unless the run asks for a fresh server; ``stop`` and
``close`` give a leased server back instead of stopping it (docs/server-broker.md).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import replace
from pathlib import Path

from parity.process import (
    ManagedProcess,
    StopRecord,
    forget_at_exit,
    reap_on_sigterm,
    remove_at_exit,
    slices,
)
from parity.serve.launch import (
    GROUP_EXIT_WAIT_S,
    LOG_TAIL_BYTES,
    STARTUP_OUTCOMES,
    StartRecipe,
    StartupRecord,
    group_members,
    launch,
    listens_in_group,
    recipe,
    wait_group_gone,
)
from parity.serve.lease import BrokerClient, BrokerError, LeasedProcess, broker_from_env
from parity.serve.spec import DEFAULT_STARTUP_TIMEOUT_S, ServerConfig
from parity.serve.targets import HOST, TargetSpec, parse_target, server_argv, share_env

__all__ = [
    "STARTUP_OUTCOMES",
    "ServerHandle",
    "ServerPool",
    "StartupRecord",
    "group_members",
    "listens_in_group",
    "wait_group_gone",
]

PENDING_SLACK_S = 30.0  # beyond a start's own bound: its probe and bookkeeping
FROM_ENV = object()  # ServerPool(broker=FROM_ENV): the broker the environment names, if any


def _result(future: Future[ServerHandle], timeout: float) -> ServerHandle:
    """A background start's handle (its exception re-raised: a harness bug), bounded."""
    for wait_s in slices(timeout):  # not one long wait: see parity.process.slices
        try:
            return future.result(timeout=wait_s)
        except FuturesTimeout:
            if future.done():  # done since the wait ended, or it raised a TimeoutError itself
                return future.result()
    raise TimeoutError(f"a server start did not end within {timeout:g} s")


class ServerHandle:
    """One server of the pool: its startup record, URL, process and (once stopped) stop record."""

    def __init__(
        self,
        target: TargetSpec,
        config: ServerConfig,
        startup: StartupRecord,
        process: ManagedProcess | LeasedProcess | None,
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

    @property
    def leased(self) -> bool:
        """Lent by a server broker: ``stop`` gives it back instead of stopping it."""
        return isinstance(self.process, LeasedProcess)

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
        gigabytes can take a moment to exit after its leader has been reaped.

        A leased server is given back to its broker (None: this run did not stop it)."""
        if self.process is None:
            return None
        if isinstance(self.process, LeasedProcess):
            self.process.release()
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

    def __init__(
        self,
        log_dir: str | Path | None = None,
        *,
        grace_s: float = 10.0,
        broker: BrokerClient | None | object = FROM_ENV,
    ) -> None:
        self.broker: BrokerClient | None = (
            broker_from_env() if broker is FROM_ENV else broker  # type: ignore[assignment]
        )
        # ``prestart`` starts servers from worker threads, which cannot install the handler
        # that reaps them on SIGTERM: install it here, from the thread that makes the pool.
        reap_on_sigterm()
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
        # processes of starts still waiting for health: ``close`` stops them rather than
        # waiting for each to come up (a Ctrl-C mid-run is answered in seconds)
        self._in_flight: set[ManagedProcess] = set()
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
        share: bool = True,
    ) -> ServerHandle:
        """The server for (target, config): started now, or the one started earlier
        (``fresh``: a new one in any case, the earlier one stopped and kept in ``retired``).
        With a broker, a target that declares ``share`` is leased unless ``fresh`` or not
        ``share`` (a run whose results a used server could change)."""
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
            new = self._start_probed(spec, config, timeout, share and not fresh)
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
        share: bool = True,
    ) -> None:
        """Start (target, config) in the background so a later ``get`` finds it ready; a
        no-op when that server was started before (up, refused or stopped since: replacing
        one is ``get``'s job) or is starting (never two copies of a config).
        At most ``max_parallel_starts`` starts run at once. A server a broker would lend is
        asked of the broker instead (it starts one unless it has one)."""
        key = self.key(target, config)
        timeout = target.serve.startup_timeout_s or startup_timeout_s
        if share and self.broker is not None and target.serve.share is not None:
            try:
                self.broker.warm(shared_recipe(target, config, timeout))
            except BrokerError:
                pass  # no broker after all: get starts it
            return
        with self._lock:
            if self.closed or key in self._pending or key in self._claimed or key in self._handles:
                return
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=self.max_parallel_starts, thread_name_prefix="parity-prestart"
                )
            self._pending[key] = self._executor.submit(
                self._start_probed, target, config, timeout, False
            )

    def starting(self) -> int:
        """How many servers are being started ahead of need."""
        with self._lock:
            return sum(not f.done() for f in self._pending.values())

    def _start_probed(
        self, spec: TargetSpec, config: ServerConfig, timeout: float, share: bool
    ) -> ServerHandle:
        handle = self._start(spec, config, timeout, share)
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
        """Stop every server (those still starting ahead of need too: their processes are
        stopped first, which ends their starts); return (label, stop record) pairs. Removes an
        own temp log dir."""
        with self._lock:
            self.closed = True
            pending, self._pending = list(self._pending.items()), {}
            in_flight = list(self._in_flight)
        for process in in_flight:  # their health waits then end at once
            process.stop(grace_s=min(self.grace_s, 5.0))
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

    def _start(
        self, spec: TargetSpec, config: ServerConfig, timeout_s: float, share: bool
    ) -> ServerHandle:
        """A server for (spec, config): leased from the broker when ``share`` allows it and
        the target declares ``share``, else started here (a start that failed is stopped, its
        record and log kept)."""
        start = recipe(spec, config, timeout_s)
        if share and self.broker is not None and spec.serve.share is not None:
            try:
                record, leased = self.broker.lease(shared_recipe(spec, config, timeout_s))
                return ServerHandle(spec, config, record, leased)
            except BrokerError:
                pass  # the broker is gone: start our own, as without one
        mine: list[ManagedProcess] = []

        def spawned(process: ManagedProcess) -> None:
            with self._lock:
                mine.append(process)
                self._in_flight.add(process)
                closed = self.closed
            if closed:  # the pool closed while this start was being set up
                process.stop(grace_s=min(self.grace_s, 5.0))

        try:
            record, process = launch(
                start, lambda: self._next_log(start), grace_s=self.grace_s, on_spawn=spawned
            )
        finally:
            with self._lock:
                self._in_flight.difference_update(mine)
        handle = ServerHandle(spec, config, record, process)
        if not record.started:
            handle.stop()  # already stopped: records it and waits for the group to be gone
        return handle

    def _next_log(self, start: StartRecipe) -> Path:
        with self._lock:
            self._count += 1
            return self.log_dir / f"{self._count:02d}-{_slug(start.label)}.log"


def shared_recipe(spec: TargetSpec, config: ServerConfig, timeout_s: float) -> StartRecipe:
    """The recipe a broker starts (spec, config) by: the target's ``share`` environment
    added, its reset paths named (``parity.targets.defs.ShareDef``)."""
    start = recipe(spec, config, timeout_s)
    if spec.serve.share is None:
        return start
    return replace(start, env={**start.env, **share_env(spec)}, reset=spec.serve.share.reset)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:60].strip("_") or "server"
