"""How busy the machine is: the load average and CPU count, recorded as evidence.

A timing verdict (a stall, a timeout, a latency difference) on a loaded machine may be the
machine, not the server. Every server start and every verdict records a ``LoadSample``, and
reports show it beside timing verdicts and FLAKY results.
"""

from __future__ import annotations

import os
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
