"""Evidence taken while a request is wedged (held open): scheduler dump, stack dump, SIGTERM.

- ``scheduler_dump``: our engine's ``GET /debug/scheduler`` (``engine/core/sched/debug.py``):
  queues, blocks held, and why the head waiting request cannot be scheduled. Other targets
  have no such endpoint (upstream has none: its closest evidence is the "Running: 0 reqs,
  Waiting: 1 reqs" log line and ``vllm:num_requests_waiting``).
- ``stack_dump``: ``py-spy dump`` of every process of the server's group when ``py-spy`` is on
  PATH (it is not a dependency; otherwise the record says so).
- ``sigterm``: SIGTERM to the server's process group while the wedged request is still
  outstanding, ``sigterm_grace_s`` to exit, then SIGKILL (``ServerHandle.stop``); the
  readiness path is sampled meanwhile. The port's wedged server survived SIGTERM
  (docs/failure-classes.md): it kept answering ``/health`` 200. A server that stopped answering
  (it is shutting down) but is still alive at the end of the grace period is given up to
  ``SIGTERM_EXTENSION`` times the grace period more before SIGKILL: on a busy machine upstream's
  three processes can take longer than 5 s to exit, and that is a slow exit, not survival.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from parity._codec import JsonMixin
from parity.serve.observe import HealthSample
from parity.serve.pool import ServerHandle, group_members

DUMP_TIMEOUT_S = 5.0
PY_SPY_TIMEOUT_S = 15.0
SIGTERM_EXTENSION = 2.0  # a shutting-down server gets grace * (1 + this) in all


@dataclass(frozen=True, slots=True)
class SigtermRecord(JsonMixin):
    """SIGTERM while wedged: did the server exit within the grace period?"""

    grace_s: float
    outstanding: int  # requests held open when SIGTERM was sent
    sigterm_sufficed: bool | None  # None: the server was already gone
    exit_s: float | None  # SIGTERM -> exit (or -> SIGKILL's reaping)
    returncode: int | None
    health_after: tuple[HealthSample, ...] = ()  # ms since SIGTERM
    client_after: tuple[str, ...] = ()  # what each held request saw after SIGTERM
    extended_s: float = 0.0  # given past the grace period because it had stopped serving

    @property
    def result(self) -> str:
        if self.sigterm_sufficed is None:
            return "not sent (server already gone)"
        if self.sigterm_sufficed:
            slow = (
                f"; past the {self.grace_s:g} s grace period, after it had stopped serving"
                if self.extended_s
                else ""
            )
            return f"exited {self.exit_s:.2f} s after SIGTERM (rc {self.returncode}{slow})"
        waited = f"the {self.grace_s:g} s grace period"
        if self.extended_s:
            waited += f" and {self.extended_s:g} s more (it had stopped serving)"
        return (
            f"survived SIGTERM for {waited}; SIGKILL after "
            f"{self.exit_s:.2f} s (rc {self.returncode})"
        )

    @property
    def label(self) -> str:
        if self.sigterm_sufficed is None:
            return "gone"
        return "exited" if self.sigterm_sufficed else "survived"


@dataclass(frozen=True, slots=True)
class WedgeEvidence(JsonMixin):
    """Dumps taken while the wedged request(s) were held open."""

    scheduler: dict[str, Any] | None = None  # /debug/scheduler JSON
    scheduler_note: str | None = None  # why there is none
    stack: str | None = None  # py-spy output
    stack_note: str | None = None
    t_ms: float = 0.0  # since the leg started
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def explanation(self) -> str | None:
        sched = (self.scheduler or {}).get("scheduler", self.scheduler or {})
        head = sched.get("head_waiting") if isinstance(sched, dict) else None
        return head.get("explanation") if isinstance(head, dict) else None

    @property
    def preempted_itself(self) -> bool:
        """The dump shows a wedge: nothing running and a preempted request that cannot fit."""
        sched = (self.scheduler or {}).get("scheduler", {})
        if not isinstance(sched, dict) or not sched.get("wedged"):
            return False
        return any(w.get("num_preemptions", 0) >= 1 for w in sched.get("waiting") or ())


async def scheduler_dump(handle: ServerHandle) -> tuple[dict[str, Any] | None, str | None]:
    if not handle.capabilities.get("debug_scheduler", False):
        return None, f"{handle.label} has no scheduler dump endpoint (GET /debug/scheduler)"
    try:
        async with httpx.AsyncClient(timeout=DUMP_TIMEOUT_S) as client:
            resp = await client.get(f"{handle.url}/debug/scheduler")
    except httpx.HTTPError as exc:
        return None, f"GET /debug/scheduler failed: {type(exc).__name__}"
    if resp.status_code != 200:
        return None, f"GET /debug/scheduler answered {resp.status_code}"
    try:
        return resp.json(), None
    except ValueError:
        return None, "GET /debug/scheduler answered non-JSON"


async def stack_dump(handle: ServerHandle) -> tuple[str | None, str | None]:
    spy = shutil.which("py-spy")
    if spy is None:
        return None, "py-spy not installed"
    if handle.process is None or not handle.alive():
        return None, "server not running"
    return await asyncio.to_thread(_py_spy, spy, handle.process.pid)


def _py_spy(spy: str, pgid: int) -> tuple[str | None, str | None]:
    parts: list[str] = []
    for pid in group_members(pgid):
        try:
            done = subprocess.run(
                [spy, "dump", "--pid", str(pid)],
                capture_output=True,
                text=True,
                timeout=PY_SPY_TIMEOUT_S,
                process_group=0,
            )
        except subprocess.TimeoutExpired:
            parts.append(f"# pid {pid}: py-spy dump timed out")
            continue
        parts.append(f"# pid {pid}\n{done.stdout.strip() or done.stderr.strip()}")
    return ("\n\n".join(parts) or None), (None if parts else "no processes to dump")


async def sigterm(
    handle: ServerHandle, grace_s: float, outstanding: int, held: list[Any]
) -> SigtermRecord:
    """SIGTERM the server while ``outstanding`` requests are held; record how it ended."""
    if handle.process is None or not handle.alive():
        return SigtermRecord(grace_s, outstanding, None, None, None)
    sent = time.monotonic()
    samples: list[HealthSample] = []

    def shutting_down() -> bool:  # read by the stopping thread: the latest sample decides
        return bool(samples) and samples[-1].status != 200

    stopper = asyncio.create_task(
        asyncio.to_thread(
            handle.stop,
            grace_s,
            extension_s=grace_s * SIGTERM_EXTENSION,
            shutting_down=shutting_down,
        )
    )
    async with httpx.AsyncClient(timeout=1.0) as client:
        while not stopper.done():
            began = time.monotonic()
            try:
                resp = await client.get(f"{handle.url}{handle.target.serve.health}")
                sample = HealthSample(round((began - sent) * 1000, 1), resp.status_code)
            except httpx.HTTPError as exc:
                sample = HealthSample(
                    round((began - sent) * 1000, 1), None, error=type(exc).__name__
                )
            if not samples or (samples[-1].status, samples[-1].error) != (
                sample.status,
                sample.error,
            ):
                samples.append(sample)  # changes only
            await asyncio.wait({stopper}, timeout=0.25)
    record = await stopper
    await asyncio.sleep(0.1)  # let the held bodies see the closed connections
    client_after = []
    for body in held:
        if body.ended_at is None:
            client_after.append("still open when the server was gone")
        else:
            how = body.error or "clean end of body"
            got = "no status line" if body.status is None else f"HTTP {body.status}"
            got += f", {body.num_bytes} bytes in all"
            if body.finish_reason:
                got += f", finish_reason {body.finish_reason}"
            client_after.append(f"ended {body.ended_at - sent:+.2f} s after SIGTERM: {how} ({got})")
    return SigtermRecord(
        grace_s=grace_s,
        outstanding=outstanding,
        sigterm_sufficed=None if record is None else record.sigterm_sufficed,
        exit_s=None if record is None else round(record.exit_s, 3),
        returncode=None if record is None else record.returncode,
        health_after=tuple(samples),
        client_after=tuple(client_after),
        extended_s=0.0 if record is None else record.extended_s,
    )
