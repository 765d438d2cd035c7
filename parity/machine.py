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
SPEED_START_DELAY_S = 1.0  # the side-by-side loops start together, after every process is up


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


def machine_speed(timeout_s: float = 60.0) -> MachineSpeed:
    """Time ``SPEED_LOOP_N`` iterations in this process, then in ``cpus`` fresh processes at
    once (bounded by ``timeout_s``; processes that do not finish are terminated)."""
    import multiprocessing

    alone = _speed_loop()
    processes = max(1, os.cpu_count() or 1)
    context = multiprocessing.get_context("spawn")
    with context.Pool(processes) as pool:
        pool.map(_speed_loop, [None] * processes)  # every worker up and importing nothing more
        start_at = time.time() + SPEED_START_DELAY_S
        result = pool.map_async(_speed_loop, [start_at] * processes, chunksize=1)
        times = result.get(timeout=timeout_s)
    return MachineSpeed(round(alone, 3), round(max(times), 3), processes)
