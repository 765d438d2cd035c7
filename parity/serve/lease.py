"""A run's side of a server broker (``parity.serve.broker``): lease a server, release it after.

``broker_from_env()`` is the broker the environment names (``PARITY_SERVER_BROKER``, a Unix
socket path), or None. ``BrokerClient.lease(recipe)`` returns the startup record and, when the
server started, a ``LeasedProcess``: what ``ServerPool`` keeps as a handle's process. It
answers ``alive``, ``pid`` and ``log_tail`` like a ``ManagedProcess``, but ``release`` gives
the server back instead of stopping it. The lease is a held connection, so a run that dies
gives its servers back too. A broker that cannot be reached is no broker: the pool starts its
own server, as without one.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import psutil

from parity._codec import from_json
from parity.process import slices
from parity.serve.launch import StartRecipe, StartupRecord

ENV = "PARITY_SERVER_BROKER"  # the broker's socket path, for the runs
MAX_LINE = 1 << 20  # the longest message either side reads
CONNECT_TIMEOUT_S = 5.0  # to connect, and for a plain request's answer
RELEASE_TIMEOUT_S = 60.0  # the broker checks the server before it answers
LEASE_SLACK_S = 300.0  # beyond the start's own bound: waiting for another run's lease


class BrokerError(RuntimeError):
    """The broker could not be reached or answered something else than expected."""


class LeasedProcess:
    """A server lent by a broker (see the module docstring)."""

    def __init__(self, connection: socket.socket, pid: int, log_path: str | None) -> None:
        self._connection = connection
        self.pid = pid
        self.log_path = Path(log_path) if log_path else None
        self.released: bool | None = None  # once released: whether the broker kept it

    def alive(self) -> bool:
        """Alive and still this run's (a released server is no longer this run's to use)."""
        if self.released is not None:
            return False
        try:
            return psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def log_tail(self, max_bytes: int = 4000) -> str:
        try:
            data = self.log_path.read_bytes() if self.log_path else b""
        except OSError:
            return ""
        return data[-max_bytes:].decode("utf-8", "replace")

    def release(self) -> None:
        """Give the server back (idempotent); bounded."""
        if self.released is not None:
            return
        self.released = False
        try:
            self._connection.settimeout(RELEASE_TIMEOUT_S)
            self._connection.sendall(b'{"op": "release"}\n')
            answer = _read_line(self._connection, RELEASE_TIMEOUT_S)
            self.released = bool(answer.get("kept"))
        except (OSError, BrokerError):
            pass
        finally:
            self._connection.close()


class BrokerClient:
    """Talks to the broker at ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def lease(self, start: StartRecipe) -> tuple[StartupRecord, LeasedProcess | None]:
        """A server for ``start`` (its record; the process when it started)."""
        connection = self._send({"op": "lease", "recipe": start.to_json()})
        try:
            answer = _read_line(connection, start.timeout_s + LEASE_SLACK_S)
            record = from_json(StartupRecord, answer["startup"])
        except (OSError, KeyError, TypeError, ValueError) as exc:
            connection.close()
            raise BrokerError(f"broker at {self.path}: {exc}") from None
        record = _as_label(record, start.label)
        if not record.started or answer.get("pid") is None:
            connection.close()
            return record, None
        return record, LeasedProcess(connection, int(answer["pid"]), answer.get("log"))

    def warm(self, start: StartRecipe) -> None:
        """Ask the broker to start ``start``'s server now, unless it has one."""
        self.request({"op": "warm", "recipe": start.to_json()})

    def status(self) -> dict[str, Any]:
        return self.request({"op": "status"})

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """One message, one answer."""
        connection = self._send(message)
        try:
            return _read_line(connection, CONNECT_TIMEOUT_S)
        finally:
            connection.close()

    def _send(self, message: dict[str, Any]) -> socket.socket:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.settimeout(CONNECT_TIMEOUT_S)
        try:
            connection.connect(self.path)
            connection.sendall(json.dumps(message).encode() + b"\n")
        except OSError as exc:
            connection.close()
            raise BrokerError(f"broker at {self.path}: {exc.strerror or exc}") from None
        return connection


def broker_from_env() -> BrokerClient | None:
    """The broker ``PARITY_SERVER_BROKER`` names, or None."""
    path = os.environ.get(ENV, "").strip()
    return BrokerClient(path) if path else None


def _read_line(connection: socket.socket, timeout_s: float) -> dict[str, Any]:
    """One line's JSON object, within ``timeout_s`` (``TimeoutError`` past it), read in slices
    (``parity.process.slices``: a lease can take a server's whole start)."""
    data = b""
    waits = slices(timeout_s)
    while not data.endswith(b"\n"):
        wait_s = next(waits, None)
        if wait_s is None:
            raise TimeoutError(f"no answer within {timeout_s:g} s")
        connection.settimeout(wait_s)
        try:
            chunk = connection.recv(65536)
        except TimeoutError:
            continue
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_LINE:
            raise BrokerError("answer too long")
    try:
        answer = json.loads(data or b"null")
    except ValueError as exc:
        raise BrokerError(f"not JSON: {exc}") from None
    if not isinstance(answer, dict) or not answer.get("ok"):
        error = answer.get("error") if isinstance(answer, dict) else answer
        raise BrokerError(f"broker refused: {error}")
    return answer


def _as_label(record: StartupRecord, label: str) -> StartupRecord:
    """The record under the lessee's own label (another run may have started the server)."""
    from dataclasses import replace

    return replace(record, target=label)
