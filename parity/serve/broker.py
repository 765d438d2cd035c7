"""A server broker: one long-lived process that starts servers and lends them to run after run.

Most of a serve-tier run's time is server starts (an oracle start is three interpreters
importing torch and vLLM: docs/oracle-on-cpu.md). Runs that need the same server (equal
``StartRecipe.key``) one after another, e.g. the test suite's several whole-suite runs against
the oracle, can lease one server from a broker instead of each starting its own. The broker
listens on a Unix socket (``ENV`` names it to the runs); ``parity.serve.lease`` is the client.

What is lent, and when (docs/server-broker.md):

- Only servers of targets that declare ``share`` (``parity.targets.defs.ShareDef``), only to
  runs that do not ask for a fresh server, one run at a time (a lease is exclusive: two runs'
  requests never reach one server together). A lease ends when the run releases it or its
  connection closes (a run that dies releases too).
- Back in the broker, a server is lent again only if it is alive, answers its readiness path,
  and every ``share.reset`` path answers 200 without ``{"success": false}`` (vLLM's
  ``/reset_prefix_cache`` empties the prefix cache and fails while any block is held, so it
  also proves no request is left running). Anything else and the server is stopped.
- A refused start is the answer for its recipe from then on (nothing is held); a start that
  timed out is not remembered. A run that finds its recipe's server lent to another waits up to
  ``wait_s`` for it, then starts another copy. At most ``max_idle`` idle servers are kept
  (least recently used stopped first), fewer when memory runs short.

Every process is started and reaped as the pool does (``parity.serve.launch``); closing the
broker (SIGTERM, SIGINT, or its parent's exit when ``--parent`` is given) stops them all.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import socketserver
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import psutil

from parity._codec import from_json
from parity.process import ManagedProcess
from parity.serve.launch import (
    GROUP_EXIT_WAIT_S,
    HOST,
    StartRecipe,
    StartupRecord,
    launch,
    wait_group_gone,
)
from parity.serve.lease import MAX_LINE

RESET_WAIT_S = 15.0  # a just-released server may still be aborting its last requests
CHECK_TIMEOUT_S = 10.0
MAX_LEASE_S = 6 * 3600.0  # a lease nobody releases or closes in this long is taken back
SERVER_MEMORY_BYTES = 4 * 1024**3  # an oracle server holds ~3 GiB across its processes


@dataclass
class Copy:
    """One server the broker started: its record, process and state."""

    id: int
    key: str
    recipe: StartRecipe
    state: str = "starting"  # starting, idle, leased, refused, gone
    record: StartupRecord | None = None
    process: ManagedProcess | None = None
    claimed: bool = False  # a lease waits for this start
    leases: int = 0  # runs it was lent to and got back from
    last_used: float = field(default_factory=time.monotonic)

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def answer(self) -> dict[str, Any]:
        """What a lessee is told: the startup record (``reused``: earlier leases), the
        process group and the log."""
        assert self.record is not None
        record = replace(self.record, reused=self.leases)
        return {
            "ok": True,
            "copy": self.id,
            "startup": record.to_json(),
            "pid": self.process.pid if self.process is not None else None,
            "log": str(self.process.log_path) if self.process is not None else None,
        }


class Broker:
    """The servers of a broker, by recipe key (see the module docstring)."""

    def __init__(
        self, log_dir: Path, *, max_idle: int = 4, wait_s: float = 180.0, grace_s: float = 10.0
    ) -> None:
        self.log_dir = log_dir
        self.max_idle, self.wait_s, self.grace_s = max_idle, wait_s, grace_s
        self._copies: dict[str, list[Copy]] = {}
        self._cond = threading.Condition()
        self._ids = itertools.count(1)
        self._logs = itertools.count(1)
        self.closed = False
        # per recipe ("label key"): how many were started, lent (new or again), stopped after
        # a lease (not clean), and stopped idle to make room (the least recently used): for
        # the status, so a run can say where its starts went
        self.tally: dict[str, dict[str, int]] = {}
        self.recipes: dict[str, str] = {}  # the same names: each one's command line

    # -- leasing ---------------------------------------------------------------------------
    def lease(self, start: StartRecipe) -> Copy:
        """A server for ``start`` for this caller alone (or its refusal, or a timed-out
        start's record); waits, bounded, for a copy another caller holds."""
        deadline = time.monotonic() + self.wait_s
        with self._cond:
            while True:
                if self.closed:
                    raise RuntimeError("the broker is closing")
                copies = self._copies.setdefault(start.key, [])
                for copy in [c for c in copies if c.state == "idle" and not c.alive()]:
                    self._drop(copy)
                picked = self._pick(copies)
                if picked is None and (not copies or time.monotonic() >= deadline):
                    picked = self._begin(start, claimed=True)
                if picked is not None:
                    break
                self._cond.wait(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            while picked.state == "starting":  # bounded: the start's own bound
                self._cond.wait(timeout=1.0)
            if picked.state == "leased":
                self._count(picked, "lent")
            return picked

    def _pick(self, copies: list[Copy]) -> Copy | None:
        """A refusal, an idle copy (now leased) or an unclaimed start (now claimed)."""
        for copy in copies:
            if copy.state == "refused":
                return copy
            if copy.state == "idle":
                copy.state = "leased"
                return copy
            if copy.state == "starting" and not copy.claimed:
                copy.claimed = True
                return copy
        return None

    def warm(self, start: StartRecipe) -> None:
        """Start a server for ``start`` in the background unless it has one (any state)."""
        with self._cond:
            if not self.closed and not self._copies.get(start.key):
                self._begin(start, claimed=False)

    def release(self, copy: Copy) -> bool:
        """Take back a lent server: kept for the next lease when it checks clean (see the
        module docstring), else stopped. True when kept."""
        if copy.state != "leased":
            return False
        clean = copy.alive() and _clean(copy)
        with self._cond:
            if not clean or self.closed:
                copy.state = "gone"
                self._count(copy, "unclean" if not clean else "closed")
            else:
                copy.state, copy.leases, copy.last_used = "idle", copy.leases + 1, time.monotonic()
            self._cond.notify_all()
        if not clean:
            self._stop(copy)
        self._trim()
        return clean

    # -- starting and stopping --------------------------------------------------------------
    def _begin(self, start: StartRecipe, *, claimed: bool) -> Copy:
        copy = Copy(next(self._ids), start.key, start, claimed=claimed)
        self._copies.setdefault(start.key, []).append(copy)
        self._count(copy, "started")
        threading.Thread(target=self._start, args=(copy,), daemon=True).start()
        return copy

    def _start(self, copy: Copy) -> None:
        self._make_room()
        start = copy.recipe
        record, process = launch(start, lambda: self._log(start), grace_s=self.grace_s)
        if not record.started and process is not None:
            wait_group_gone(process.pid, GROUP_EXIT_WAIT_S)
        with self._cond:
            copy.record, copy.process = record, process if record.started else None
            if self.closed and record.started:
                copy.state = "gone"
            elif record.started:
                copy.state = "leased" if copy.claimed else "idle"
            else:  # a refusal is remembered; a timeout is not (a busy moment is not an answer)
                copy.state = "refused" if record.outcome == "startup_refused" else "gone"
                if copy.state == "gone":
                    self._drop(copy)
            self._cond.notify_all()
        if copy.state == "gone" and record.started:
            self._stop(copy)

    def _log(self, start: StartRecipe) -> Path:
        slug = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in start.label)[:40]
        return self.log_dir / f"{next(self._logs):03d}-{slug}.log"

    def _drop(self, copy: Copy) -> None:
        copies = self._copies.get(copy.key, [])
        if copy in copies:
            copies.remove(copy)

    def _stop(self, copy: Copy) -> None:
        with self._cond:
            self._drop(copy)
        if copy.process is not None:
            copy.process.stop(grace_s=self.grace_s)
            wait_group_gone(copy.process.pid, GROUP_EXIT_WAIT_S)

    def _idle(self) -> list[Copy]:
        with self._cond:
            copies = [c for cs in self._copies.values() for c in cs if c.state == "idle"]
        return sorted(copies, key=lambda c: c.last_used)

    def _trim(self) -> None:
        """At most ``max_idle`` idle servers: the least recently used go first."""
        idle = self._idle()
        for copy in idle[: max(0, len(idle) - self.max_idle)]:
            self._retire(copy)

    def _make_room(self) -> None:
        """Before a start: stop idle servers (least recently used first) while memory for one
        more server is short."""
        for copy in self._idle():
            if psutil.virtual_memory().available > 2 * SERVER_MEMORY_BYTES:
                return
            self._retire(copy)

    def _retire(self, copy: Copy) -> None:
        with self._cond:
            if copy.state != "idle":
                return
            copy.state = "gone"
            self._count(copy, "evicted")
        self._stop(copy)

    def _count(self, copy: Copy, event: str) -> None:
        """One more ``event`` for the copy's label (called with the lock held)."""
        name = f"{copy.recipe.label} {copy.key}"
        self.recipes.setdefault(name, " ".join(copy.recipe.argv))
        counts = self.tally.setdefault(name, {})
        counts[event] = counts.get(event, 0) + 1

    @property
    def started(self) -> int:
        """Servers started, over every recipe."""
        return self._total("started")

    @property
    def lent(self) -> int:
        """Leases granted, over every recipe."""
        return self._total("lent")

    def _total(self, event: str) -> int:
        with self._cond:
            return sum(counts.get(event, 0) for counts in self.tally.values())

    def status(self) -> dict[str, Any]:
        with self._cond:
            copies = [c for cs in self._copies.values() for c in cs]
            return {
                "ok": True,
                "started": self.started,
                "lent": self.lent,
                "tally": {name: dict(counts) for name, counts in self.tally.items()},
                "recipes": dict(self.recipes),
                "servers": [
                    {"copy": c.id, "label": c.recipe.label, "state": c.state, "leases": c.leases}
                    for c in copies
                ],
            }

    def close(self) -> None:
        """Stop every server (those still starting stop themselves when their start ends)."""
        with self._cond:
            self.closed = True
            copies = [c for cs in self._copies.values() for c in cs]
            self._cond.notify_all()
        for copy in copies:
            if copy.state != "starting":
                self._stop(copy)


def _clean(copy: Copy) -> bool:
    """The server answers its readiness path and every reset path says it succeeded (retried
    while a reset fails: the last run's aborted requests may still hold blocks)."""
    url = f"http://{HOST}:{copy.record.port if copy.record else 0}"
    deadline = time.monotonic() + RESET_WAIT_S
    try:  # a connection per request: a server may close one after each answer
        no_reuse = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(timeout=CHECK_TIMEOUT_S, limits=no_reuse) as client:
            for path in copy.recipe.reset:
                while not _reset_ok(client.post(url + path)):
                    if time.monotonic() >= deadline:
                        return False
                    time.sleep(0.25)
            return client.get(url + copy.recipe.health).status_code == 200
    except httpx.HTTPError:
        return False


def _reset_ok(response: httpx.Response) -> bool:
    if response.status_code != 200:
        return False
    try:
        body = response.json()
    except ValueError:
        return True
    return not (isinstance(body, dict) and body.get("success") is False)


# -- the socket --------------------------------------------------------------------------
class _Handler(socketserver.StreamRequestHandler):
    """One connection: one JSON line in, one out; a lease holds the connection until the
    lessee sends ``{"op": "release"}`` or closes it."""

    server: _SocketServer

    def handle(self) -> None:
        broker = self.server.broker
        try:
            message = json.loads(self.rfile.readline(MAX_LINE) or b"null")
            op = message.get("op") if isinstance(message, dict) else None
            if op == "status":
                return self._send(broker.status())
            if op not in ("lease", "warm"):
                return self._send({"ok": False, "error": f"unknown op {op!r}"})
            start = from_json(StartRecipe, message["recipe"])
        except (ValueError, KeyError, TypeError) as exc:
            return self._send({"ok": False, "error": f"bad request: {exc}"})
        if op == "warm":
            broker.warm(start)
            return self._send({"ok": True})
        try:
            copy = broker.lease(start)
        except RuntimeError as exc:
            return self._send({"ok": False, "error": str(exc)})
        if copy.state != "leased":  # a refusal or a timeout: nothing is held
            return self._send(copy.answer())
        kept = False
        try:
            self._send(copy.answer())
            self.connection.settimeout(MAX_LEASE_S)
            self.rfile.readline(MAX_LINE)  # "release", or EOF when the lessee is gone
        except OSError:
            pass
        finally:
            kept = broker.release(copy)
        self._send({"ok": True, "kept": kept})

    def _send(self, data: dict[str, Any]) -> None:
        try:
            self.wfile.write(json.dumps(data).encode() + b"\n")
            self.wfile.flush()
        except OSError:
            pass


class _SocketServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, broker: Broker) -> None:
        self.broker = broker
        super().__init__(path, _Handler)


def serve(socket_path: str, log_dir: Path, *, parent: int | None = None, **options: Any) -> None:
    """Run a broker on ``socket_path`` until SIGTERM, SIGINT or (with ``parent``) that
    process's exit; then stop every server and remove the socket."""
    broker = Broker(log_dir, **options)
    server = _SocketServer(socket_path, broker)
    os.chmod(socket_path, 0o600)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"parity broker: listening on {socket_path}", flush=True)
    try:
        while not done.wait(1.0):
            if parent is not None and not psutil.pid_exists(parent):
                break
    finally:
        server.shutdown()
        server.server_close()
        broker.close()
        Path(socket_path).unlink(missing_ok=True)
        print(
            f"parity broker: stopped ({broker.started} server(s) started, {broker.lent} lease(s))",
            flush=True,
        )


def add_broker_commands(sub: Any) -> None:
    """``parity broker --socket PATH``: run a server broker in the foreground."""
    broker = sub.add_parser(
        "broker",
        help="lend servers to run after run (export PARITY_SERVER_BROKER=PATH in the runs)",
    )
    _arguments(broker)
    broker.set_defaults(func=_cmd_broker)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--socket", required=True, help="the Unix socket to listen on")
    parser.add_argument("--log-dir", help="server logs (default: a temporary folder)")
    parser.add_argument("--parent", type=int, help="stop when this process has exited")
    parser.add_argument("--max-idle", type=int, default=4, help="idle servers kept (default 4)")
    parser.add_argument(
        "--wait-s",
        type=float,
        default=180.0,
        help="how long a run waits for a server another run holds before it gets its own "
        "(default 180)",
    )


def _cmd_broker(args: argparse.Namespace) -> int:
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="parity-broker-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        serve(args.socket, log_dir, parent=args.parent, max_idle=args.max_idle, wait_s=args.wait_s)
    finally:
        if not args.log_dir:
            shutil.rmtree(log_dir, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m parity.serve.broker")
    _arguments(parser)
    return _cmd_broker(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
