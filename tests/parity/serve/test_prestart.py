"""Servers ready before they are needed: ``ServerPool.prestart`` starts a server in the
background, a later ``get`` adopts it, and there is never more than one copy of a config;
``ServeSession`` knows every server of a run up front, in the order it needs them."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from serve_support import fake_target

from parity.loader import parse_scenario
from parity.serve.pool import ServerPool
from parity.serve.spec import ServerConfig
from parity.serve.suite import ServeSession
from parity.serve.targets import parse_target

pytestmark = pytest.mark.server


def _scenario(stem: str, block_size: int):
    text = (
        f"id: {stem}\ndescription: d\ntier: serve\nconfig: {{block_size: {block_size}}}\n"
        "requests:\n  - {id: r1, endpoint: completions, prompt: ok, max_tokens: 5}\n"
    )
    return parse_scenario(text, f"{stem}.yaml", stem=stem)


@pytest.mark.timeout(120)
def test_a_prestarted_server_is_adopted_and_started_once(tmp_path: Path) -> None:
    target = parse_target(fake_target())
    config = ServerConfig(model=str(tmp_path / "m"), engine_args={"block_size": 32})
    with ServerPool(tmp_path / "logs") as pool:
        pool.prestart(target, config, startup_timeout_s=30)
        pool.prestart(target, config, startup_timeout_s=30)  # already starting: a no-op
        deadline = time.monotonic() + 30
        while pool.starting() and time.monotonic() < deadline:
            time.sleep(0.05)
        handle = pool.get(target, config, startup_timeout_s=30)
        assert handle.startup.started and handle.alive()
        assert pool.get(target, config) is handle
        pool.prestart(target, config)  # up already: a no-op
        assert pool.starting() == 0 and len(pool.handles) == 1
        assert len(list((tmp_path / "logs").glob("*.log"))) == 1  # one process ever
    assert not handle.alive()


@pytest.mark.timeout(180)
def test_a_session_knows_its_servers_up_front_and_starts_the_first_early(tmp_path: Path) -> None:
    scenarios = [_scenario("a", 32), _scenario("b", 64), _scenario("c", 32)]
    targets = [fake_target(), fake_target()]
    with ServerPool(tmp_path / "logs") as pool:
        session = ServeSession(scenarios, targets, pool=pool)
        order = [
            (spec.label, group[0].config.engine_args["block_size"]) for spec, group in session.jobs
        ]
        first, second = (t.label for t in session.specs)
        assert order == [(first, 32), (second, 32), (first, 64), (second, 64)]
        session.begin()
        assert pool.starting() >= 1  # started in the background, nothing waited for
        results = session.run()
        assert [r.status.value for r in results] == ["pass"] * 3
        # one start per (target, config): the prestarted ones were adopted, not duplicated
        assert len(list((tmp_path / "logs").glob("*.log"))) == 4


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("cores", "configs_ahead"), [(1.25, 1), (1.9, 2)])
def test_how_many_configs_start_ahead_is_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cores: float, configs_ahead: int
) -> None:
    import parity.serve.suite as suite
    from parity.machine import MachineSpeed

    speed = MachineSpeed(0.1, round(0.2 / cores, 4), 2)
    monkeypatch.setattr(suite, "recent_machine_speed", lambda: speed)
    scenarios = [_scenario("a", 32), _scenario("b", 64), _scenario("c", 128)]
    with ServerPool(tmp_path / "logs") as pool:
        session = ServeSession(scenarios, [fake_target(), fake_target()], pool=pool)
        assert session.machine is None  # nothing measured before the first start
        session.begin()
        assert session.configs_ahead == configs_ahead and session.machine == speed
        # every target's server of that many configs was asked for, no more
        deadline = time.monotonic() + 60
        while pool.starting() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(list((tmp_path / "logs").glob("*.log"))) == 2 * configs_ahead
        results = session.run()
        assert [r.status.value for r in results] == ["pass"] * 3
        assert len(list((tmp_path / "logs").glob("*.log"))) == 6  # one start per server


def test_a_run_of_one_config_measures_nothing(tmp_path: Path) -> None:
    session = ServeSession([_scenario("a", 32)], [fake_target(), fake_target()])
    try:
        session.begin()
        assert session.machine is None and session.configs_ahead == 1
    finally:
        session.close()


@pytest.mark.timeout(60)
def test_closing_stops_a_start_in_flight_instead_of_waiting_for_it(tmp_path: Path) -> None:
    """What a Ctrl-C mid-run leads to: the pool is closed while a server it started ahead of
    need is still coming up (this one never does). The start is ended by stopping its process,
    in seconds, not waited for until its startup bound."""
    import os
    import sys

    never_healthy = f"external:{sys.executable} -c 'import time; time.sleep(600)' --port {{port}}"
    target = parse_target(never_healthy)
    config = ServerConfig(model=str(tmp_path / "m"), engine_args={"block_size": 32})
    pool = ServerPool(tmp_path / "logs", broker=None)
    try:
        pool.prestart(target, config, startup_timeout_s=300)
        deadline = time.monotonic() + 20
        while not list((tmp_path / "logs").glob("*.log")) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the process runs and its health wait has begun
        assert pool.starting() == 1
        began = time.monotonic()
        pool.close()
        took = time.monotonic() - began
    finally:
        pool.close()
    assert took < 15, f"close waited {took:.1f} s for a start in flight"
    [handle] = pool.handles
    assert not handle.startup.started
    assert handle.process is not None and not handle.process.alive()
    with pytest.raises(ProcessLookupError):
        os.killpg(handle.process.pid, 0)  # the whole group is gone
