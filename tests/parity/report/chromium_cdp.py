"""A tiny, dependency-free DevTools client for Debian's headless chromium (tests only).

``load_page(url, screenshot=...)`` starts ``chromium --headless --remote-debugging-pipe`` in
its own process group (the pipe is fds 3 and 4 of the child, NUL-terminated JSON messages),
opens ``url``, waits for the load event, collects every console error, uncaught exception and
error log entry (CSP violations included), evaluates an expression, writes a full-page
screenshot, and reaps the group (SIGTERM, grace, SIGKILL). Every wait has a deadline.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--enable-logging=stderr",
    "--v=0",
    "--remote-debugging-pipe",
)
WIDTH = 1280


class ChromiumError(RuntimeError):
    """Chromium did not answer in time or said no."""


@dataclass
class PageResult:
    errors: list[str] = field(default_factory=list)  # console errors, exceptions, error logs
    value: Any = None  # the evaluated expression
    screenshot: Path | None = None
    stderr: str = ""


def chromium_path() -> str | None:
    found = shutil.which("chromium") or (CHROMIUM if os.path.exists(CHROMIUM) else None)
    return found


class _Pipe:
    def __init__(self, write_fd: int, read_fd: int, deadline: float) -> None:
        self.write_fd, self.read_fd, self.deadline = write_fd, read_fd, deadline
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def _read_message(self) -> dict[str, Any]:
        while b"\0" not in self.buffer:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise ChromiumError("chromium did not answer before the deadline")
            ready, _, _ = select.select([self.read_fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self.read_fd, 1 << 20)
                if not chunk:
                    raise ChromiumError("chromium closed the DevTools pipe")
                self.buffer += chunk
        raw, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(raw)

    def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> Any:
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.write_fd, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read_message()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise ChromiumError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def wait_event(self, method: str, timeout: float) -> dict[str, Any]:
        until = min(self.deadline, time.monotonic() + timeout)
        for event in self.events:
            if event["method"] == method:
                return event
        saved, self.deadline = self.deadline, until
        try:
            while True:
                event = self._read_message()
                if "method" in event:
                    self.events.append(event)
                    if event["method"] == method:
                        return event
        finally:
            self.deadline = saved

    def drain(self, seconds: float) -> None:
        """Collect events for ``seconds`` more (late console errors)."""
        saved, self.deadline = self.deadline, time.monotonic() + seconds
        try:
            while True:
                event = self._read_message()
                if "method" in event:
                    self.events.append(event)
        except ChromiumError:
            pass
        finally:
            self.deadline = saved


def _errors(events: list[dict[str, Any]]) -> list[str]:
    found = []
    for event in events:
        method, params = event["method"], event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            text = details.get("exception", {}).get("description") or details.get("text")
            found.append(f"exception: {text}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = [a.get("value", a.get("description")) for a in params.get("args", [])]
            found.append(f"console.{params['type']}: {args}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            found.append(f"log ({entry.get('source')}): {entry.get('text')}")
    return found


def _stop(process: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    try:  # the group may outlive its leader: renderer, zygote
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def load_page(
    url: str,
    *,
    expression: str = "null",
    screenshot: Path | None = None,
    timeout_s: float = 60.0,
    max_height: int = 12000,
) -> PageResult:
    """Open ``url`` headless; return console errors, ``expression``'s value, the screenshot."""
    binary = chromium_path()
    if binary is None:
        raise ChromiumError(
            "chromium is not installed: run 'make chromium' (apt-get install chromium)"
        )
    deadline = time.monotonic() + timeout_s
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    # move the child's ends above 3/4 so the dup2 calls below cannot clobber each other
    # (the originals stay open until the child is spawned: fds 3 and 4 are then surely open in
    # this process, as pass_fds needs, and never become subprocess's own error pipe)
    child_in = fcntl.fcntl(to_child_r, fcntl.F_DUPFD_CLOEXEC, 10)
    child_out = fcntl.fcntl(from_child_w, fcntl.F_DUPFD_CLOEXEC, 10)

    def wire() -> None:
        os.dup2(child_in, 3)
        os.dup2(child_out, 4)

    with tempfile.TemporaryDirectory(prefix="parity-chromium-") as profile:
        log = Path(profile) / "stderr.log"
        try:
            with open(log, "wb") as err:
                process = subprocess.Popen(
                    [
                        binary,
                        *FLAGS,
                        f"--user-data-dir={profile}/user",
                        f"--window-size={WIDTH},2000",
                    ],
                    stdin=subprocess.DEVNULL,
                    # its singleton socket's folder goes under the temp folder and stays there
                    # when the browser is killed; under the profile it goes with the profile
                    env={**os.environ, "TMPDIR": profile},
                    stdout=err,
                    stderr=err,
                    pass_fds=(3, 4),
                    preexec_fn=wire,
                    process_group=0,
                )
        except OSError:
            os.close(to_child_w)
            os.close(from_child_r)
            raise
        finally:
            for fd in (child_in, child_out, to_child_r, from_child_w):
                os.close(fd)
        pipe = _Pipe(to_child_w, from_child_r, deadline)
        try:
            result = _drive(pipe, url, expression, screenshot, max_height)
        finally:
            try:
                pipe.send("Browser.close")
            except (ChromiumError, OSError):
                pass
            _stop(process)
            os.close(to_child_w)
            os.close(from_child_r)
            result_stderr = log.read_text(errors="replace")[-20000:]
    result.stderr = result_stderr
    return result


def _drive(
    pipe: _Pipe, url: str, expression: str, screenshot: Path | None, max_height: int
) -> PageResult:
    target = pipe.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for method in ("Runtime.enable", "Log.enable", "Page.enable"):
        pipe.send(method, session=session)
    metrics = {"width": WIDTH, "height": 2000, "deviceScaleFactor": 1, "mobile": False}
    pipe.send("Emulation.setDeviceMetricsOverride", metrics, session=session)
    pipe.events.clear()
    pipe.send("Page.navigate", {"url": url}, session=session)
    pipe.wait_event("Page.loadEventFired", timeout=30.0)
    pipe.drain(0.5)
    evaluated = pipe.send(
        "Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=session
    )
    if "exceptionDetails" in evaluated:
        raise ChromiumError(f"evaluate failed: {evaluated['exceptionDetails']}")
    result = PageResult(value=evaluated.get("result", {}).get("value"))
    if screenshot is not None:
        layout = pipe.send("Page.getLayoutMetrics", session=session)
        height = int(min(layout.get("cssContentSize", layout["contentSize"])["height"], max_height))
        pipe.send(
            "Emulation.setDeviceMetricsOverride", {**metrics, "height": height}, session=session
        )
        shot = pipe.send("Page.captureScreenshot", {"format": "png"}, session=session)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        result.screenshot = screenshot
    pipe.drain(0.2)
    result.errors = _errors(pipe.events)
    return result
