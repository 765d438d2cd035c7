"""``parity.machine``: the load sample and the speed probe that make a run's seconds comparable
with another day's."""

from __future__ import annotations

import os

import pytest

from parity.machine import (
    LoadSample,
    MachineSpeed,
    load_now,
    machine_speed,
    recent_machine_speed,
    side_by_side_starts,
)

pytestmark = pytest.mark.timeout(120)


def test_load_now_has_the_cpu_count_and_three_averages() -> None:
    sample = load_now()
    assert sample.cpus == os.cpu_count()
    assert min(sample.load1, sample.load5, sample.load15) >= 0.0
    assert LoadSample.from_json(sample.to_json()) == sample


def test_machine_speed_times_the_loop_alone_and_side_by_side() -> None:
    speed = machine_speed()
    assert speed.processes == max(1, os.cpu_count() or 1)
    assert 0.0 < speed.alone_s < 60.0 and 0.0 < speed.side_by_side_s < 60.0
    assert MachineSpeed.from_json(speed.to_json()) == speed
    assert "side by side" in speed.describe()


@pytest.mark.parametrize(
    ("alone", "side_by_side", "cores"),
    [
        # a server of the run before still exiting during the first side-by-side loops
        ([0.20, 0.20], [0.34, 0.21], 1.9),
        # ... or during the first loop alone
        ([0.34, 0.20], [0.21, 0.21], 1.9),
        # a neighbour that lasts slows every round: the machine still measures busy
        ([0.20, 0.21], [0.40, 0.39], 1.03),
    ],
)
def test_each_time_is_the_fastest_of_its_rounds(
    monkeypatch: pytest.MonkeyPatch, alone: list[float], side_by_side: list[float], cores: float
) -> None:
    import parity.machine as machine

    loops, rounds = iter(alone), iter(side_by_side)
    monkeypatch.setattr(machine, "_speed_loop", lambda: next(loops))
    monkeypatch.setattr(machine, "_side_by_side", lambda _n, _deadline: next(rounds))
    monkeypatch.setattr(machine.os, "cpu_count", lambda: 2)
    assert machine.machine_speed(rounds=2).effective_cores == cores


def test_effective_cores_is_work_done_per_core_time() -> None:
    # two loops side by side, each as fast as one alone: two cores' worth
    assert MachineSpeed(0.5, 0.5, 2).effective_cores == 2.0
    # each twice as slow: one core's worth (two processes time-sharing one core)
    assert MachineSpeed(0.5, 1.0, 2).effective_cores == 1.0
    assert MachineSpeed(0.5, 0.0, 2).effective_cores == 0.0


def test_side_by_side_starts_follows_the_measured_cores() -> None:
    # the two 2-core machines of docs/oracle-on-cpu.md: one start at a time on the first,
    # two at once on the second
    assert side_by_side_starts(MachineSpeed(0.9, 1.44, 2)) == 1  # 1.25 cores' worth
    assert side_by_side_starts(MachineSpeed(0.13, 0.142, 2)) == 2  # 1.83
    assert side_by_side_starts(MachineSpeed(0.14, 0.14, 2)) == 2
    assert side_by_side_starts(MachineSpeed(0.14, 0.28, 2)) == 1  # one core's worth (or busy)
    assert side_by_side_starts(MachineSpeed(0.1, 0.1, 8)) == 8
    assert side_by_side_starts(MachineSpeed(0.1, 0.0, 2)) == 1  # nothing measured


def test_a_recent_measurement_is_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    import parity.machine as machine

    calls: list[int] = []

    def measured() -> MachineSpeed:
        calls.append(1)
        return MachineSpeed(0.1, 0.1 * len(calls), 2)

    monkeypatch.setattr(machine, "machine_speed", measured)
    monkeypatch.setattr(machine, "_RECENT", [])
    first = recent_machine_speed()
    assert recent_machine_speed() is first and len(calls) == 1
    monkeypatch.setattr(machine, "RECENT_S", 0.0)
    assert recent_machine_speed() != first and len(calls) == 2
