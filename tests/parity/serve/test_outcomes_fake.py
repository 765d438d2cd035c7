"""Every request outcome, on a tiny misbehaving server reached as an ``external:`` target.

The fake server (``fake_server.py``) starts in well under a second, so each outcome of the
taxonomy is produced on purpose and checked with its timing bound: stalls are declared within
``stall_s`` + 3 s of the last progress, and a request whose server-side token counter keeps
moving is not a hang even with no byte for longer than ``stall_s``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import pytest
from serve_support import fake_target

from parity.serve import (
    ServeLimits,
    ServerConfig,
    ServeRequestSpec,
    ServeRun,
    parse_target,
    run_requests,
    run_serve,
)
from parity.serve.client import CONFIRM_FACTOR

pytestmark = pytest.mark.server

CONFIG = ServerConfig(model="/nonexistent/fake-model", served_model_name="fake-served")
LIMITS = ServeLimits(startup_timeout_s=30.0, request_timeout_s=20.0, stall_s=1.0)


def _req(mode: str, stream: bool, request_id: str = "r1", **fields: object) -> ServeRequestSpec:
    return ServeRequestSpec(id=request_id, prompt=mode, stream=stream, max_tokens=8, **fields)


def _run(pool, *requests: ServeRequestSpec, limits: ServeLimits = LIMITS) -> ServeRun:
    run = run_requests(pool, fake_target(), CONFIG, list(requests), limits)
    assert run.startup.started, run.startup.describe()
    return run


def _assert_stall_timing(run: ServeRun, request_id: str, stall_s: float) -> None:
    obs = run.observation(request_id)
    assert obs.stall is not None
    last = obs.t_last_byte_ms if obs.t_last_byte_ms is not None else 0.0
    assert stall_s * 1000 <= obs.stall.t_verdict_ms - last <= (stall_s + 3.0) * 1000
    assert obs.stall.health is not None and obs.stall.health.status == 200
    assert obs.stall.server_alive


@pytest.mark.timeout(120)
def test_external_target_gets_the_flags_and_completes(serve_pool) -> None:
    run = _run(serve_pool, _req("ok", True, "s"), _req("ok", False, "n"))
    assert run.facts is not None and run.facts.model_id == "fake-served"  # flags reached it
    assert run.target.startswith("external:")
    stream, plain = run.observation("s"), run.observation("n")
    assert (stream.outcome, plain.outcome) == ("completed", "completed")
    assert stream.done and len(stream.frames) == 6 and stream.frames[-1].done
    assert stream.result.token_ids == (100, 101, 102, 103, 104)
    assert stream.result.text == " t0 t1 t2 t3 t4" and stream.result.finish_reason == "length"
    assert stream.result.num_token_frames == 5
    assert 0 <= stream.t_headers_ms <= stream.t_first_byte_ms <= stream.t_first_token_ms
    assert [f.t_ms for f in stream.frames] == sorted(f.t_ms for f in stream.frames)
    assert plain.result.token_ids == (100, 101) and plain.result.usage["total_tokens"] == 3
    assert plain.num_bytes == len(plain.body.encode())
    assert run.metrics_after.generation_tokens - run.metrics_before.generation_tokens == 5
    assert json.loads(json.dumps(run.to_json())) == run.to_json()
    assert ServeRun.from_json(run.to_json()) == run


@pytest.mark.timeout(120)
def test_mid_stream_stall_is_declared_while_open(serve_pool) -> None:
    run = _run(serve_pool, _req("stall", True))
    obs = run.observation("r1")
    assert obs.outcome == "mid_stream_stall", obs.detail
    assert obs.result.token_ids == (100, 101, 102) and not obs.done
    _assert_stall_timing(run, "r1", LIMITS.stall_s)
    assert obs.stall.metrics is not None and obs.stall.metrics.running == 0.0


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("mode", "stream", "headers"), [("hang", False, False), ("headers-hang", True, True)]
)
def test_zero_byte_hang(serve_pool, mode: str, stream: bool, headers: bool) -> None:
    run = _run(serve_pool, _req(mode, stream))
    obs = run.observation("r1")
    assert obs.outcome == "zero_byte_hang", obs.detail
    assert obs.num_bytes == 0 and (obs.t_headers_ms is not None) == headers
    _assert_stall_timing(run, "r1", LIMITS.stall_s)


@pytest.mark.timeout(120)
def test_a_quiet_request_the_server_says_it_runs_is_confirmed_before_a_stall(serve_pool) -> None:
    """No byte and no token for stall_s, but the server's counters say the request runs: a
    slow server, not a wedged one, so the verdict waits out the confirmation window."""
    run = _run(serve_pool, _req("busy", False))
    obs = run.observation("r1")
    assert obs.outcome == "zero_byte_hang", obs.detail
    assert obs.stall is not None and obs.stall.load is not None and obs.stall.load.cpus >= 1
    quiet_ms = obs.stall.t_verdict_ms - obs.stall.t_last_progress_ms
    assert quiet_ms >= LIMITS.stall_s * CONFIRM_FACTOR * 1000, quiet_ms
    assert quiet_ms <= (LIMITS.stall_s * CONFIRM_FACTOR + 3.0) * 1000, quiet_ms


@pytest.mark.timeout(120)
def test_moving_token_counter_is_progress_not_a_hang(serve_pool) -> None:
    run = _run(serve_pool, _req("generate", False))  # 4 s without a byte, counter moving
    obs = run.observation("r1")
    assert obs.outcome == "completed", obs.detail
    assert obs.t_first_byte_ms > 3 * LIMITS.stall_s * 1000


@pytest.mark.timeout(120)
def test_cut_connection_is_disconnected(serve_pool) -> None:
    run = _run(serve_pool, _req("cut", True))
    obs = run.observation("r1")
    assert obs.outcome == "disconnected", obs.detail
    assert obs.result.token_ids == (100, 101) and obs.exception is not None
    assert run.server_alive_after


@pytest.mark.timeout(120)
def test_slow_but_progressing_request_times_out(serve_pool) -> None:
    limits = ServeLimits(startup_timeout_s=30.0, request_timeout_s=2.0, stall_s=1.0)
    run = _run(serve_pool, _req("drip", True), limits=limits)
    obs = run.observation("r1")
    assert obs.outcome == "timeout", obs.detail
    assert obs.stall is None and 2 <= obs.num_tokens <= 8  # one token per 0.3 s
    assert 2000 <= obs.t_end_ms <= 5000


@pytest.mark.timeout(120)
def test_repeat_concurrency_and_arrival_offsets(serve_pool) -> None:
    late = _req("ok", True, "late", at_ms=300.0)
    many = _req("ok", False, "many", repeat=4, concurrency=2)
    run = _run(serve_pool, many, late)
    ids = [o.request_id for o in run.observations]
    assert ids == ["many#0", "many#1", "many#2", "many#3", "late"]
    assert set(run.outcomes.values()) == {"completed"}
    assert run.observation("late").t_send_ms >= 300.0


@pytest.mark.timeout(120)
def test_sigkill_mid_request_is_crashed_and_the_pool_restarts(serve_pool) -> None:
    handle = serve_pool.get(fake_target("--instance", "kill"), CONFIG)
    killer = threading.Timer(0.8, os.killpg, (handle.process.pid, signal.SIGKILL))
    killer.start()
    try:
        run = run_serve(handle, [_req("stall", True, "a"), _req("hang", False, "b")],
                        ServeLimits(request_timeout_s=20.0, stall_s=10.0))  # fmt: skip
    finally:
        killer.cancel()
    assert run.outcomes == {"a": "crashed", "b": "crashed"}
    assert run.observation("a").t_end_ms < 3000 and not run.server_alive_after
    again = serve_pool.get(fake_target("--instance", "kill"), CONFIG)
    assert again is not handle and again.alive() and handle in serve_pool.retired


@pytest.mark.timeout(60)
def test_startup_refused_has_the_error_line(serve_pool) -> None:
    code = "import sys; print('INFO starting'); print('ValueError: bad config', flush=True); sys.exit(1)"
    target = f'external:{sys.executable} -c "{code}" {{port}} {{flags}}'
    run = run_requests(serve_pool, target, CONFIG, [_req("ok", False)], LIMITS)
    assert run.startup.outcome == "startup_refused"
    assert run.startup.error == "ValueError: bad config" and run.startup.returncode == 1
    assert run.outcomes == {"r1": "startup_refused"}
    assert serve_pool.get(target, CONFIG) is serve_pool.get(target, CONFIG)  # cached, not retried


@pytest.mark.timeout(60)
def test_startup_timeout_is_bounded(serve_pool) -> None:
    target = f'external:{sys.executable} -c "import time; time.sleep(120)" {{port}} {{flags}}'
    limits = ServeLimits(startup_timeout_s=2.0)
    began = time.monotonic()
    run = run_requests(serve_pool, target, CONFIG, [_req("ok", False)], limits)
    assert time.monotonic() - began < 15.0
    assert run.startup.outcome == "startup_timeout"
    assert run.outcomes == {"r1": "startup_timeout"}
    handle = serve_pool.get(target, CONFIG)
    assert handle.stop_record is not None and not handle.alive()


def test_target_label_marks_unchecked() -> None:
    assert parse_target("oracle[unchecked]").label == "oracle[unchecked]"
