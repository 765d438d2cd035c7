"""A protocol worker's process: one JSON line out, one JSON line back, every wait bounded.

``WorkerProcess`` starts the worker in its own process group (``parity.process.spawn``, as every
process the harness starts) with pipes on stdin, stdout and stderr, and
``exchange(message, timeout_s)`` writes one request line and reads one response line, both
through ``select`` against one deadline, draining stderr meanwhile (its last lines are kept for
error messages; it never fills its pipe and blocks the worker). Every failure is one
``WorkerError`` line: the worker exited (its exit code and last stderr lines), did not answer
within the bound, or wrote something that is not one JSON object per line. ``stop`` reaps the
whole group (SIGTERM, grace, SIGKILL); the harness's exit hooks reap it too.

Upstream: none (docs/scheduler-protocol.md).
"""

from __future__ import annotations

import collections
import os
import select
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any

from contract import protocol
from parity.process import MAIN_WAIT_SLICE_S, reap_groups, reaped, spawn, track, untrack

MAX_LINE_BYTES = 64 << 20  # a longer response line is garbage
STDERR_LINES = 40  # kept for error messages
_CHUNK = 1 << 16


class WorkerError(RuntimeError):
    """The worker failed: exited, hung, or broke the protocol (one line)."""


class WorkerProcess:
    """One running worker; not reusable once ``broken`` (then ``stop`` it and start another)."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        label: str = "worker",
    ) -> None:
        self.argv = list(argv)
        self.label = label
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self._stderr_partial = b""
        self._stdout_buffer = b""
        self.broken = False
        try:
            self.proc = spawn(self.argv, env=env, cwd=cwd)  # pipes on stdin, stdout, stderr
        except OSError as exc:
            raise WorkerError(f"{label}: cannot run {self.argv[0]!r}: {exc.strerror}") from None
        track(self)
        assert self.proc.stdin and self.proc.stdout and self.proc.stderr
        self._in = self.proc.stdin.fileno()
        self._out = self.proc.stdout.fileno()
        self._err = self.proc.stderr.fileno()
        for fd in (self._in, self._out, self._err):
            os.set_blocking(fd, False)

    def exchange(self, message: dict[str, Any], timeout_s: float, what: str) -> dict[str, Any]:
        """Send one request and return its response object, within ``timeout_s`` in total."""
        if self.broken:
            raise WorkerError(f"{self.label}: the worker is unusable after an earlier failure")
        deadline = time.monotonic() + timeout_s
        try:
            self._write(protocol.encode(message), deadline, what, timeout_s)
            line = self._read_line(deadline, what, timeout_s)
            return protocol.decode(line)
        except protocol.ProtocolError as exc:
            self.broken = True
            raise WorkerError(f"{self.label}: garbage on stdout during {what}: {exc}") from None
        except WorkerError:
            self.broken = True
            raise

    def _write(self, data: bytes, deadline: float, what: str, timeout_s: float) -> None:
        view = memoryview(data)
        while view:
            readable = self._wait([self._err], [self._in], deadline, what, timeout_s)
            if self._in in readable[1]:
                try:
                    view = view[os.write(self._in, view) :]
                except BrokenPipeError:
                    raise self._exited(what) from None
            if self._err in readable[0]:
                self._drain_stderr()

    def _read_line(self, deadline: float, what: str, timeout_s: float) -> bytes:
        while b"\n" not in self._stdout_buffer:
            if len(self._stdout_buffer) > MAX_LINE_BYTES:
                raise protocol.ProtocolError(f"a line longer than {MAX_LINE_BYTES} bytes")
            readable, _ = self._wait([self._out, self._err], [], deadline, what, timeout_s)
            if self._err in readable:
                self._drain_stderr()
            if self._out in readable:
                chunk = os.read(self._out, _CHUNK)
                if not chunk:
                    raise self._exited(what)
                self._stdout_buffer += chunk
        line, _, self._stdout_buffer = self._stdout_buffer.partition(b"\n")
        if self._stdout_buffer:  # the protocol never sends two lines for one request
            raise protocol.ProtocolError(
                f"more than one line for one request: {self._stdout_buffer[:80]!r}"
            )
        return line

    def _wait(
        self, reads: list[int], writes: list[int], deadline: float, what: str, timeout_s: float
    ) -> tuple[list[int], list[int]]:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise WorkerError(
                f"{self.label}: no answer to {what} within {timeout_s:g} s{self._tail_text()}"
            )
        # in slices, not one long wait (parity.process.slices): the callers loop until deadline
        readable, writable, _ = select.select(reads, writes, [], min(remaining, MAIN_WAIT_SLICE_S))
        return readable, writable

    def _drain_stderr(self) -> bool:
        """Read what stderr has; False at EOF or when nothing was there."""
        try:
            chunk = os.read(self._err, _CHUNK)
        except BlockingIOError:
            return False
        if not chunk:
            return False
        *lines, self._stderr_partial = (self._stderr_partial + chunk).split(b"\n")
        for raw in lines:
            text = raw.decode("utf-8", "replace").rstrip()
            if text:
                self.stderr_tail.append(text)
        if len(self._stderr_partial) > _CHUNK:
            self.stderr_tail.append(self._stderr_partial[:200].decode("utf-8", "replace"))
            self._stderr_partial = b""
        return True

    def _exited(self, what: str) -> WorkerError:
        """The worker closed its pipes: wait (bounded) for its exit code and describe it."""
        try:
            code: int | None = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        self._drain_all_stderr()
        status = f"exited with code {code}" if code is not None else "closed its stdout"
        if code is not None and code < 0:
            status = f"was killed by {signal.Signals(-code).name}"
        return WorkerError(f"{self.label}: the worker {status} during {what}{self._tail_text()}")

    def _drain_all_stderr(self) -> None:
        """What the exited worker left on stderr (bounded: 1 s), its last partial line too."""
        deadline = time.monotonic() + 1.0
        while (remaining := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([self._err], [], [], remaining)
            if not readable or not self._drain_stderr():
                break
        if self._stderr_partial.strip():
            self.stderr_tail.append(self._stderr_partial[:200].decode("utf-8", "replace"))
            self._stderr_partial = b""

    def _tail_text(self, lines: int = 3) -> str:
        tail = [line[:200] for line in list(self.stderr_tail)[-lines:]]
        return f"; last stderr: {' | '.join(tail)}" if tail else ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace_s: float = 5.0) -> int | None:
        """Reap the whole group: SIGTERM, up to ``grace_s``, SIGKILL. Idempotent."""
        reap_groups([self.proc], grace_s)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        self.broken = True
        reaped(self.proc)
        untrack(self)
        return self.proc.returncode
