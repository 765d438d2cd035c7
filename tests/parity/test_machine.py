"""``parity.machine``: the load sample and the speed probe that make a run's seconds comparable
with another day's."""

from __future__ import annotations

import os

import pytest

from parity.machine import LoadSample, MachineSpeed, load_now, machine_speed

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


def test_effective_cores_is_work_done_per_core_time() -> None:
    # two loops side by side, each as fast as one alone: two cores' worth
    assert MachineSpeed(0.5, 0.5, 2).effective_cores == 2.0
    # each twice as slow: one core's worth (two processes time-sharing one core)
    assert MachineSpeed(0.5, 1.0, 2).effective_cores == 1.0
    assert MachineSpeed(0.5, 0.0, 2).effective_cores == 0.0
