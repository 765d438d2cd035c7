"""How busy the machine is: the load average and CPU count, recorded as evidence.

A timing verdict (a stall, a timeout, a latency difference) on a loaded machine may be the
machine, not the server. Every server start and every verdict records a ``LoadSample``, and
reports show it beside timing verdicts and FLAKY results.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from parity._codec import JsonMixin


@dataclass(frozen=True, slots=True)
class LoadSample(JsonMixin):
    """The 1, 5 and 15 minute load averages and the CPU count at one moment."""

    load1: float
    load5: float
    load15: float
    cpus: int

    def describe(self) -> str:
        return f"load {self.load1:.2f}/{self.load5:.2f}/{self.load15:.2f} on {self.cpus} CPUs"


def load_now() -> LoadSample:
    """The machine's load right now (zeros where the platform has no load average)."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        one = five = fifteen = 0.0
    return LoadSample(round(one, 2), round(five, 2), round(fifteen, 2), os.cpu_count() or 1)


# A fixed amount of pure-Python work: about 0.45 s on one core of the machine this was written on.
SPEED_LOOP_N = 5_000_000
SPEED_START_DELAY_S = 0.5  # the side-by-side loops start together, after every process is up
SPEED_ROUNDS = 2  # each measurement is the fastest of this many (a passing disturbance filtered)


@dataclass(frozen=True, slots=True)
class MachineSpeed(JsonMixin):
    """How fast the machine is right now: one CPU-bound loop alone, and the same loop run by
    ``cpus`` processes side by side (the slowest of them). Times are comparable across runs and
    days where load averages are not: a loop that takes twice as long is a machine (or a
    neighbour) twice as slow, whatever the code under test did."""

    alone_s: float
    side_by_side_s: float
    processes: int

    @property
    def effective_cores(self) -> float:
        """How many of one core's worth of work the processes did together."""
        if self.side_by_side_s <= 0:
            return 0.0
        return round(self.processes * self.alone_s / self.side_by_side_s, 2)

    def describe(self) -> str:
        return (
            f"speed loop {self.alone_s:.2f} s alone, {self.side_by_side_s:.2f} s with "
            f"{self.processes} side by side ({self.effective_cores:.2f} cores' worth)"
        )


def _speed_loop(start_at: float | None = None) -> float:
    if start_at is not None:  # wall clock: the same instant in every process
        time.sleep(max(0.0, start_at - time.time()))
    began = time.perf_counter()
    total = 0
    for i in range(SPEED_LOOP_N):
        total += i
    return time.perf_counter() - began


# The side-by-side processes: fresh interpreters that run ``_speed_loop`` itself from the shared
# start instant and print its time.
_LOOP_SCRIPT = (
    "import sys; from parity.machine import _speed_loop; print(_speed_loop(float(sys.argv[1])))"
)


def machine_speed(timeout_s: float = 60.0, rounds: int = SPEED_ROUNDS) -> MachineSpeed:
    """Time ``SPEED_LOOP_N`` iterations in this process, then in ``cpus`` fresh processes at
    once (bounded by ``timeout_s``; processes still running then are killed), ``rounds``
    times; each of the two is the fastest of its rounds. About 1 s a round on an idle 2-core
    machine.

    One round misjudged a 2-core machine both ways in runs started right after another run
    (docs/oracle-on-cpu.md): 1.17-1.28 cores' worth, so one start at a time and a default
    suite of 222-230 s against 156-165 s, and once 3.25. A neighbour that lasts (a CPU hog)
    slows every round, so a busy machine still measures busy."""
    processes = max(1, os.cpu_count() or 1)
    deadline = time.monotonic() + timeout_s
    alone: list[float] = []
    side_by_side: list[float] = []
    for _ in range(max(1, rounds)):
        alone.append(_speed_loop())
        side_by_side.append(_side_by_side(processes, deadline))
    return MachineSpeed(round(min(alone), 3), round(min(side_by_side), 3), processes)


def _side_by_side(processes: int, deadline: float) -> float:
    """The slowest of ``processes`` fresh interpreters running the loop from one instant."""
    import subprocess
    import sys

    start_at = time.time() + SPEED_START_DELAY_S
    argv = [sys.executable, "-c", _LOOP_SCRIPT, repr(start_at)]
    children = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for _ in range(processes)
    ]
    times: list[float] = []
    try:
        for child in children:
            out, _ = child.communicate(timeout=max(0.1, deadline - time.monotonic()))
            times.append(float(out))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=5.0)
    return max(times)


_RECENT: list[tuple[float, MachineSpeed]] = []  # (when, what): this process's last measurement
RECENT_S = 300.0


def recent_machine_speed() -> MachineSpeed:
    """``machine_speed()``, measured again only when this process's last measurement is more
    than ``RECENT_S`` old (a test session runs many short suites)."""
    now = time.monotonic()
    if not _RECENT or now - _RECENT[-1][0] > RECENT_S:
        _RECENT[:] = [(now, machine_speed())]
    return _RECENT[-1][1]


# Below this many cores' worth, two CPU-bound server starts side by side take longer than the
# same two one after the other (docs/oracle-on-cpu.md: 43-49 s each against 18 s alone at 1.25
# cores' worth; 34-35 s each against 23-25 s alone at 1.83).
SIDE_BY_SIDE_MIN_CORES = 1.6


def side_by_side_starts(speed: MachineSpeed) -> int:
    """How many CPU-bound server starts (an oracle's is three interpreters importing torch
    and vLLM, one after the other) to keep going at once on a machine measured as ``speed``:
    one below ``SIDE_BY_SIDE_MIN_CORES`` cores' worth, else about one per core's worth."""
    cores = speed.effective_cores
    if cores < SIDE_BY_SIDE_MIN_CORES:
        return 1
    return max(1, int(cores + 0.4))
