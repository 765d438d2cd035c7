"""Stalls and a crash on ``oracle[unchecked]`` (upstream's capacity check disabled, test-only).

bs 32, 2 blocks (one usable), M 2048, a 3-token prompt, max_tokens 56 (docs/oracle-on-cpu.md): the
request fills its one block (30 tokens), preempts itself and waits forever. Streaming sees 30
tokens then nothing (``mid_stream_stall``); non-streaming sees nothing (``zero_byte_hang``).
Both verdicts come within ``stall_s`` + 3 s of the last progress, with ``/health`` 200 and the
metrics (running 0, waiting 1) sampled while the request was still open. Killing the server
mid-request is ``crashed``.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest
from serve_support import WEDGE_ARGS, WEDGE_PROMPT

from contract.scripted.script import expected
from parity.serve import ServeLimits, ServeRun, run_serve

pytestmark = [pytest.mark.oracle, pytest.mark.server]

STALL_S = 2.0
LIMITS = ServeLimits(startup_timeout_s=300.0, request_timeout_s=60.0, stall_s=STALL_S)
WANT = expected(WEDGE_PROMPT, 56, ignore_eos=True)


@pytest.fixture(scope="module")
def wedged_server(serve_pool, scripted_config):
    handle = serve_pool.get(
        "oracle[unchecked]", scripted_config(**WEDGE_ARGS), startup_timeout_s=300.0
    )
    assert handle.startup.started, handle.startup.describe()
    assert "oracle[unchecked]" in handle.log_tail(10**7)  # the test-only banner is logged
    return handle


def _wedge_request(make_request, stream: bool):
    return make_request(
        "wedge", prompt_token_ids=WEDGE_PROMPT, max_tokens=56, stream=stream,
        body={"ignore_eos": True},
    )  # fmt: skip


def _assert_wedge_evidence(run: ServeRun) -> None:
    obs = run.observation("wedge")
    stall = obs.stall
    assert stall is not None and stall.server_alive
    last_byte = obs.t_last_byte_ms or 0.0
    assert STALL_S * 1000 <= stall.t_verdict_ms - last_byte <= (STALL_S + 3.0) * 1000
    assert stall.health.status == 200  # green while wedged: the finding
    metrics = stall.metrics
    assert (metrics.running, metrics.waiting) == (0.0, 1.0)
    assert metrics.waiting_by_reason.get("capacity") == 1.0
    assert run.target == "oracle[unchecked]" and "Traceback" not in run.log_tail


@pytest.mark.timeout(600)
def test_streaming_wedge_is_mid_stream_stall(wedged_server, make_request) -> None:
    run = run_serve(wedged_server, [_wedge_request(make_request, True)], LIMITS)
    obs = run.observation("wedge")
    assert obs.outcome == "mid_stream_stall", obs.detail
    assert obs.status == 200 and not obs.done
    assert obs.result.token_ids == tuple(WANT[:30])
    _assert_wedge_evidence(run)


@pytest.mark.timeout(600)
def test_non_streaming_wedge_is_zero_byte_hang(wedged_server, make_request) -> None:
    run = run_serve(wedged_server, [_wedge_request(make_request, False)], LIMITS)
    obs = run.observation("wedge")
    assert obs.outcome == "zero_byte_hang", obs.detail
    assert obs.num_bytes == 0 and obs.status is None  # not even a status line
    _assert_wedge_evidence(run)


@pytest.mark.timeout(600)
def test_sigkill_mid_request_is_crashed(wedged_server, make_request) -> None:
    """Runs last: it kills the module's server (a later ``get`` would start a new one)."""
    limits = ServeLimits(request_timeout_s=60.0, stall_s=30.0)  # the crash comes first
    killer = threading.Timer(1.5, os.killpg, (wedged_server.process.pid, signal.SIGKILL))
    killer.start()
    try:
        run = run_serve(wedged_server, [_wedge_request(make_request, True)], limits)
    finally:
        killer.cancel()
    obs = run.observation("wedge")
    assert obs.outcome == "crashed", obs.detail
    assert obs.result.token_ids == tuple(WANT[:30])
    # the verdict came right after the kill (1.5 s after the timer started, send came later)
    assert obs.t_last_byte_ms < obs.t_end_ms <= 1500 + 3000 and not run.server_alive_after
