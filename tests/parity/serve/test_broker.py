"""The server broker (``parity.serve.broker``) lends one server to run after run, exclusively,
and only a server that checks clean; a pool without a reachable broker starts its own.

Each test starts its own broker (``own_broker``: waits at most 2 s for a server another run
holds, keeps at most 2 idle) and uses the fake server (``fake_server.py``) declared shareable with vLLM's reset route.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import psutil
import pytest
from serve_support import fake_target

from parity.serve.lease import BrokerClient
from parity.serve.pool import ServerPool
from parity.serve.spec import ServerConfig
from parity.serve.targets import TargetSpec, parse_target
from parity.targets.defs import ShareDef

pytestmark = [pytest.mark.server, pytest.mark.timeout(180)]

RESET = ShareDef(env={"FAKE_SHARED": "1"}, reset=("/reset_prefix_cache",))


def shared_fake() -> TargetSpec:
    """The fake server, declared as the oracle declares itself: shareable, reset between runs."""
    spec = parse_target(fake_target())
    return replace(spec, serve=replace(spec.serve, share=RESET))


def config(tmp_path: Path, block_size: int = 32) -> ServerConfig:
    return ServerConfig(model=str(tmp_path / "m"), engine_args={"block_size": block_size})


def resets(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return float(next(ln for ln in text.splitlines() if ln.startswith("fake:")).split()[-1])


def test_one_server_is_lent_run_after_run_and_reset_between(
    own_broker: BrokerClient, tmp_path: Path
) -> None:
    spec = shared_fake()
    with ServerPool(tmp_path / "a", broker=own_broker) as first:
        handle = first.get(spec, config(tmp_path))
        assert handle.leased and handle.startup.started and handle.startup.reused == 0
        pid, url = handle.process.pid, handle.url  # type: ignore[union-attr]
        assert httpx.get(f"{url}/argv", timeout=10).status_code == 200
    assert not handle.alive() and psutil.pid_exists(pid)  # given back, not stopped
    with ServerPool(tmp_path / "b", broker=own_broker) as second:
        again = second.get(spec, config(tmp_path))
        assert again.process.pid == pid and again.startup.reused == 1  # type: ignore[union-attr]
        assert again.startup.target == spec.label and resets(again.url) == 1.0
        other = second.get(spec, config(tmp_path, block_size=64))  # another config: its own
        assert other.process.pid != pid  # type: ignore[union-attr]
    status = own_broker.status()
    assert status["started"] == 2 and status["lent"] == 3
    assert not list((tmp_path / "a").glob("*.log"))  # the pools started nothing themselves


def test_a_prestart_asks_the_broker_and_the_lease_takes_that_server(
    own_broker: BrokerClient, tmp_path: Path
) -> None:
    spec = shared_fake()
    with ServerPool(tmp_path / "a", broker=own_broker) as pool:
        pool.prestart(spec, config(tmp_path))
        pool.prestart(spec, config(tmp_path))  # the broker has one (starting): a no-op
        assert pool.starting() == 0  # nothing started by the pool itself
        deadline = time.monotonic() + 30
        while [s["state"] for s in own_broker.status()["servers"]] != ["idle"]:
            assert time.monotonic() < deadline, own_broker.status()
            time.sleep(0.1)
        handle = pool.get(spec, config(tmp_path))
        assert handle.leased and handle.startup.reused == 0
    assert own_broker.status()["started"] == 1


def test_a_lease_is_exclusive(own_broker: BrokerClient, tmp_path: Path) -> None:
    """A second run does not get the server a first run holds: it waits (2 s here), then gets
    a server of its own."""
    spec = shared_fake()
    with ServerPool(tmp_path / "a", broker=own_broker) as first:
        held = first.get(spec, config(tmp_path))
        began = time.monotonic()
        with ServerPool(tmp_path / "b", broker=own_broker) as second:
            other = second.get(spec, config(tmp_path))
            assert time.monotonic() - began >= 2.0
            assert other.process.pid != held.process.pid  # type: ignore[union-attr]


def test_a_server_still_busy_when_given_back_is_stopped(
    own_broker: BrokerClient, tmp_path: Path
) -> None:
    """A request still open at release makes the reset fail: the server is stopped, never
    lent again."""
    spec = shared_fake()
    pool = ServerPool(tmp_path / "a", broker=own_broker)
    handle = pool.get(spec, config(tmp_path))
    pid = handle.process.pid  # type: ignore[union-attr]
    body = {"model": "fake", "prompt": "hang", "max_tokens": 5}
    hanging = threading.Thread(
        target=lambda: _ignore(httpx.post, f"{handle.url}/v1/completions", json=body, timeout=30),
        daemon=True,
    )
    hanging.start()
    time.sleep(0.5)
    pool.close()
    assert handle.process.released is False  # type: ignore[union-attr]
    deadline = time.monotonic() + 30
    while psutil.pid_exists(pid) and _status(pid) != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the busy server was not stopped"
        time.sleep(0.1)
    with ServerPool(tmp_path / "b", broker=own_broker) as second:
        assert second.get(spec, config(tmp_path)).process.pid != pid  # type: ignore[union-attr]


def test_what_is_never_lent(own_broker: BrokerClient, tmp_path: Path) -> None:
    """A fresh server, a run that may not share, and a target without ``share`` start their
    own; a broker that cannot be reached is no broker."""
    spec = shared_fake()
    with ServerPool(tmp_path / "a", broker=own_broker) as pool:
        assert not pool.get(spec, config(tmp_path), fresh=True).leased
        assert not pool.get(spec, config(tmp_path, 64), share=False).leased
        assert not pool.get(parse_target(fake_target()), config(tmp_path, 128)).leased
    assert own_broker.status()["started"] == 0
    gone = BrokerClient(str(tmp_path / "no-such.sock"))
    with ServerPool(tmp_path / "b", broker=gone) as pool:
        handle = pool.get(spec, config(tmp_path))
        assert handle.startup.started and not handle.leased


def test_a_refusal_is_remembered_and_bad_requests_are_answered(
    own_broker: BrokerClient, tmp_path: Path
) -> None:
    spec = shared_fake()
    refused = replace(spec, serve=replace(spec.serve, command=(sys.executable, "-c",
                      "import sys; sys.exit('ValueError: no room {port}')")))  # fmt: skip
    with ServerPool(tmp_path / "a", broker=own_broker) as pool:
        record = pool.get(refused, config(tmp_path)).startup
        assert record.outcome == "startup_refused" and "no room" in (record.error or "")
    with ServerPool(tmp_path / "b", broker=own_broker) as pool:
        assert pool.get(refused, config(tmp_path)).startup.outcome == "startup_refused"
    assert own_broker.status()["started"] == 1  # the refusal was not started again
    assert own_broker.request({"op": "status"})["ok"]
    for junk in ({"op": "dance"}, {"op": "lease", "recipe": {"nope": 1}}):
        with pytest.raises(Exception, match="broker refused"):
            own_broker.request(junk)


def _status(pid: int) -> str | None:
    try:
        return psutil.Process(pid).status()
    except psutil.Error:
        return None


def _ignore(call, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
    try:
        call(*args, **kwargs)
    except httpx.HTTPError:
        pass
