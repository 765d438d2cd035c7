"""Faults: client disconnects, SIGTERM (abort and drain), SIGKILL, a server that never starts.

- Disconnect: under a tiny KV cache, half of 24 concurrent requests are dropped by their client
  (before any byte while still waiting, or mid-stream, or a non-streaming request cut by its
  client timeout); the other half still get exactly the script's tokens, and afterwards
  nothing runs or waits and the KV cache is empty (``with_cancellation`` aborts the request:
  ``vllm/entrypoints/serve/utils/api_utils.py:51-93`` at the pin).
- SIGTERM to the server process with ``--shutdown-timeout 0`` (the default: abort mode, spec
  B6.8, ``launchers/launcher.py:252-303`` and ``v1/engine/core.py:1703-1748``): the server
  exits promptly with status 0, and every in-flight request, running or still waiting, is
  answered; the connection is never cut, and what was delivered is a prefix of the script.
  Two answers are accepted, because the pin races its engine core's abort outputs against the
  core's shutdown (``v1/utils.shutdown`` kills it at once with timeout 0):
  (a) the abort outputs win: a stream ends with a ``finish_reason: "abort"`` chunk then
  ``data: [DONE]`` (a stream that never got a token ends with ``data: [DONE]`` alone: the
  pin's completion stream generator skips an output with no text, no tokens and nothing sent
  before, ``completion/serving.py:372-379``), and a non-streaming request gets 200 with
  ``finish_reason: "abort"``; this is what our engine does;
  (b) the core dies first: an error frame ``EngineCore encountered an issue...`` (code 500)
  then ``data: [DONE]``, and HTTP 500 with that error for a non-streaming request. This is
  what the pin did on this exact test (12 of 12 requests, run once by hand against
  ``oracle``: 0.57 s to exit, status 0).
  The same holds when the SIGTERM reaches the whole process group (a terminal's Ctrl-C, a
  control-group kill). The pin does not: run once by hand, its EngineCore got the signal too,
  the API server stopped its engine client, then uvicorn logged "Waiting for connections to
  close" and none of the 12 clients got a byte more in 45 s, the API server still alive
  (a hang; reported to the lead for the ledger).
- SIGTERM with ``--shutdown-timeout 30`` drains: every in-flight request, including queued
  ones, completes with the script's full output; a request sent while draining is answered
  at once with ``finish_reason: "abort"`` (``core.py:1785-1794``); then the server exits 0.
  The pin did exactly this on this exact test (run once by hand against ``oracle``).
- SIGKILL of a server mid-run: the serve harness classifies every outstanding request
  ``crashed`` (not a hang) within seconds, and the pool starts a fresh server for the same
  config on the next ``get`` (the run continues).
- A server that never becomes healthy (a command that sleeps; one that accepts connections and
  never answers) ends as ``startup_timeout`` within its bound, its requests get that outcome,
  and no process of its group is left.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from reliability_support import (
    StreamResult,
    assert_error_shape,
    distinct_prompt,
    is_idle,
    metrics,
    send_completion,
    wait_idle,
)

from contract.scripted.script import expected
from parity.serve import ServeLimits, ServerConfig, ServeRequestSpec, ServerPool, run_serve
from parity.serve.pool import group_members

pytestmark = [pytest.mark.server]

BLOCK_SIZE = 32
TINY_KV = {"block_size": BLOCK_SIZE, "num_gpu_blocks_override": 9, "max_model_len": 256}
EXIT_BOUND_S = 10.0
HERE = Path(__file__).resolve().parent


def greedy_body(prompt: list[int], max_tokens: int, stream: bool = True) -> dict[str, Any]:
    return {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream": stream,
    }


def token_frames(result: StreamResult) -> int:
    return sum(1 for f in result.frames if f != "[DONE]" and '"token_ids":[' in f)


async def wait_until(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


# --- client disconnect ------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_client_disconnects_free_their_blocks(reliability_server) -> None:
    rng = random.Random(7)
    with reliability_server(**TINY_KV) as server:
        before = metrics(server.url)
        results = asyncio.run(disconnect_mix(server.url, rng))
        idle = wait_idle(server.url)
        assert is_idle(idle), f"left behind after disconnects: {idle.summary()}"
        # The engine still serves correctly afterwards.
        prompt = distinct_prompt(rng, 9)
        response = httpx.post(f"{server.url}/v1/completions", json=greedy_body(prompt, 20, False))
        assert response.json()["choices"][0]["token_ids"] == expected(prompt, 20, ignore_eos=True)
    kept, dropped = results
    print(f"\ndisconnect: {dropped} requests dropped by their client, {kept} completed")
    assert before.kv_cache_usage_perc == 0.0


async def disconnect_mix(url: str, rng: random.Random) -> tuple[int, int]:
    """24 requests; even ones complete, odd ones are dropped at various points."""
    plans = []
    for i in range(24):
        prompt = distinct_prompt(rng, rng.randint(5, 20))
        stream = i % 6 != 5
        close_after = None if i % 2 == 0 else (0 if i % 4 == 1 else rng.randint(2, 12))
        plans.append((prompt, stream, close_after))
    async with httpx.AsyncClient(timeout=httpx.Timeout(60.0)) as client:
        short = httpx.AsyncClient(timeout=httpx.Timeout(0.3))  # cuts non-streaming requests
        try:
            tasks = [
                send_completion(
                    short if (not stream and close_after is not None) else client,
                    url,
                    greedy_body(prompt, 60, stream),
                    close_after_frames=close_after if stream else None,
                )
                for prompt, stream, close_after in plans
            ]
            results = await asyncio.gather(*tasks)
        finally:
            await short.aclose()
    kept = dropped = 0
    for (prompt, _stream, close_after), result in zip(plans, results, strict=True):
        want = expected(prompt, 60, ignore_eos=True)
        if close_after is None:
            assert result.error is None and result.status == 200, result
            assert result.tokens() == want, f"completed request differs: {result.tokens()}"
            kept += 1
        else:
            assert result.disconnected_early or result.error is not None, result
            if result.frames:
                got = result.tokens()
                assert got == want[: len(got)], f"dropped request streamed {got}"
            dropped += 1
    return kept, dropped


# --- SIGTERM --------------------------------------------------------------------------------


@pytest.mark.timeout(240)
@pytest.mark.parametrize("whole_group", [False, True], ids=["process", "group"])
def test_sigterm_abort_mode_answers_everyone_and_exits_promptly(
    reliability_server, whole_group: bool
) -> None:
    rng = random.Random(11)
    with reliability_server(**TINY_KV) as server:
        assert server.process is not None
        proc = server.process.proc
        plans = [(distinct_prompt(rng, rng.randint(5, 20)), i % 5 != 4) for i in range(12)]
        exit_s, results = asyncio.run(
            sigterm_during(server.url, proc.pid, plans, 200, whole_group=whole_group)
        )
        assert proc.wait(EXIT_BOUND_S) == 0, server.log_tail()
    print(f"\nSIGTERM (abort): exited in {exit_s:.2f} s with {len(plans)} requests in flight")
    assert exit_s < EXIT_BOUND_S
    aborted = errored = silent = 0
    for (prompt, stream), result in zip(plans, results, strict=True):
        want = expected(prompt, 200, ignore_eos=True)
        assert result.error is None, result
        if not stream and result.status == 500:  # the pin's answer: its engine died first
            error = assert_error_shape(json.loads(result.body), 500, "SIGTERM non-streaming")
            assert error["message"].startswith("EngineCore encountered an issue"), error
            errored += 1
            continue
        assert result.status == 200, result
        got = result.tokens()
        assert got == want[: len(got)] and len(got) < len(want), got
        if stream:
            assert result.done and result.frames.count("[DONE]") == 1, result.frames[-3:]
            error = result.stream_error()
            if error is not None:
                assert_error_shape({"error": error}, error["code"], "SIGTERM error frame")
                errored += 1
            elif not got:  # never scheduled: the pin sends no empty chunk, only [DONE]
                assert result.finish_reason() in (None, "abort"), result.frames
                silent += 1
            else:
                assert result.finish_reason() == "abort", result.frames[-3:]
                aborted += 1
        else:
            assert result.finish_reason() == "abort", result.body[:500]
            aborted += 1
    print(
        f"SIGTERM (abort): {aborted} answered with finish_reason abort, {errored} error frames, "
        f"{silent} never-scheduled streams closed with [DONE] alone"
    )


async def sigterm_during(
    url: str,
    pid: int,
    plans: list[tuple[list[int], bool]],
    max_tokens: int,
    *,
    whole_group: bool = False,
) -> tuple[float, list[StreamResult]]:
    """Start the requests, SIGTERM the server (or its whole process group) once 3 streams
    have tokens; return the seconds from the signal until the process is gone."""
    streaming: list[StreamResult] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(60.0)) as client:
        tasks = [
            asyncio.create_task(
                send_completion(
                    client, url, greedy_body(p, max_tokens, s), progress=streaming.append
                )
            )
            for p, s in plans
        ]
        await wait_until(
            lambda: len({id(r) for r in streaming if token_frames(r) >= 3}) >= 3, 60, "tokens"
        )
        if whole_group:  # e.g. Ctrl-C in a terminal, systemd's control-group kill mode
            os.killpg(pid, signal.SIGTERM)
        else:  # the server process alone, as `kill PID` or a container stop
            os.kill(pid, signal.SIGTERM)
        signalled = time.monotonic()
        results = await asyncio.wait_for(asyncio.gather(*tasks), EXIT_BOUND_S * 3)
    while _alive(pid) and time.monotonic() - signalled < EXIT_BOUND_S * 3:
        await asyncio.sleep(0.02)
    return time.monotonic() - signalled, list(results)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by Popen) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.timeout(240)
def test_sigterm_with_shutdown_timeout_drains_in_flight(reliability_server) -> None:
    rng = random.Random(13)
    with reliability_server("--shutdown-timeout", "30", **TINY_KV) as server:
        assert server.process is not None
        proc = server.process.proc
        plans = [(distinct_prompt(rng, rng.randint(5, 20)), i % 5 != 4) for i in range(12)]
        late, results = asyncio.run(drain_during(server.url, proc.pid, plans))
        assert proc.wait(30) == 0, server.log_tail()
    for (prompt, stream), result in zip(plans, results, strict=True):
        want = expected(prompt, 40, ignore_eos=True)
        assert result.error is None and result.status == 200, result
        assert result.tokens() == want, f"a drained request lost tokens: {result.tokens()}"
        assert result.finish_reason() == "length"
        if stream:
            assert result.done
    assert late.status == 200, late
    assert late.finish_reason() == "abort", late.body[:500]
    assert late.tokens() == []


async def drain_during(
    url: str, pid: int, plans: list[tuple[list[int], bool]]
) -> tuple[StreamResult, list[StreamResult]]:
    streaming: list[StreamResult] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(60.0)) as client:
        tasks = [
            asyncio.create_task(
                send_completion(client, url, greedy_body(p, 40, s), progress=streaming.append)
            )
            for p, s in plans
        ]
        await wait_until(lambda: any(token_frames(r) >= 2 for r in streaming), 60, "tokens")
        os.kill(pid, signal.SIGTERM)  # the server process, as `kill PID` or a container stop
        await asyncio.sleep(0.3)
        late = await send_completion(client, url, greedy_body([5, 6, 7], 5, False))
        results = await asyncio.wait_for(asyncio.gather(*tasks), 60)
    return late, list(results)


# --- SIGKILL: crashed, and the run continues -------------------------------------------------


@pytest.mark.timeout(300)
def test_sigkill_mid_run_is_crashed_and_the_pool_restarts(
    scripted_model_dir: Path, tmp_path: Path
) -> None:
    config = ServerConfig(
        model=str(scripted_model_dir),
        engine_args={"block_size": BLOCK_SIZE, "max_model_len": 512},
        served_model_name="scripted",
    )
    rng = random.Random(17)
    specs = [
        ServeRequestSpec(
            id=f"k{i}",
            prompt_token_ids=tuple(distinct_prompt(rng, 8)),
            max_tokens=400,
            stream=i % 3 != 2,
            body={"temperature": 0.0, "ignore_eos": True, "return_token_ids": True},
        )
        for i in range(6)
    ]
    limits = ServeLimits(startup_timeout_s=120.0, request_timeout_s=120.0, stall_s=20.0)
    with ServerPool(tmp_path / "pool", grace_s=10.0) as pool:
        handle = pool.get("engine", config, startup_timeout_s=limits.startup_timeout_s)
        assert handle.startup.started, handle.startup.describe()
        assert handle.process is not None
        killer = threading.Thread(
            target=kill_when_generating, args=(handle.url, handle.process.pid)
        )
        killer.start()
        started = time.monotonic()
        run = run_serve(handle, specs, limits)
        elapsed = time.monotonic() - started
        killer.join(30)
        outcomes = run.outcomes
        print(f"\nSIGKILL: outcomes {outcomes} in {elapsed:.1f} s")
        assert set(outcomes.values()) == {"crashed"}, outcomes
        assert elapsed < 30, "the crash verdict took too long"
        assert not run.server_alive_after
        # The run continues: the same config gets a fresh server that serves.
        again = pool.get("engine", config, startup_timeout_s=limits.startup_timeout_s)
        assert again is not handle and again.startup.started, again.startup.describe()
        assert handle in pool.retired
        check = ServeRequestSpec(
            id="after", prompt_token_ids=(5, 6, 7), max_tokens=8,
            body={"temperature": 0.0, "ignore_eos": True, "return_token_ids": True},
        )  # fmt: skip
        after = run_serve(again, [check], limits)
        assert after.outcomes == {"after": "completed"}
        assert list(after.observations[0].token_ids or ()) == expected([5, 6, 7], 8, True)
        pids = [h.process.pid for h in pool.handles if h.process is not None]
    assert not any(group_members(pid) for pid in pids), "a server group outlived the pool"


def kill_when_generating(url: str, pgid: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if (metrics(url).generation_tokens or 0) >= 30:
                break
        except (httpx.HTTPError, AssertionError):
            pass
        time.sleep(0.05)
    os.killpg(pgid, signal.SIGKILL)


# --- never healthy ----------------------------------------------------------------------------

SLEEPER = "import sys, time; time.sleep(600)"
MUTE_LISTENER = (
    "import socket, sys, time\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(64)\n"
    "conns = []\n"
    "while True:\n"
    "    c, _ = s.accept(); conns.append(c)\n"
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("program", [SLEEPER, MUTE_LISTENER], ids=["sleeps", "mute-listener"])
def test_never_healthy_server_is_a_bounded_startup_timeout(
    program: str, scripted_model_dir: Path, tmp_path: Path
) -> None:
    script = tmp_path / "never_healthy.py"
    script.write_text(program)
    target = f"external:{sys.executable} {script} {{port}}"
    config = ServerConfig(model=str(scripted_model_dir), served_model_name="scripted")
    timeout_s = 3.0
    spec = ServeRequestSpec(id="x", prompt_token_ids=(5, 6), max_tokens=2)
    with ServerPool(tmp_path / "pool", grace_s=5.0) as pool:
        started = time.monotonic()
        handle = pool.get(target, config, startup_timeout_s=timeout_s)
        elapsed = time.monotonic() - started
        assert handle.startup.outcome == "startup_timeout", handle.startup.describe()
        assert timeout_s <= elapsed < timeout_s + 15, elapsed
        assert handle.process is not None and not handle.process.alive()
        assert not group_members(handle.process.pid)
        run = run_serve(handle, [spec], ServeLimits(startup_timeout_s=timeout_s))
        assert run.outcomes == {"x": "startup_timeout"}
        # Asked again, the cached verdict comes back at once (no second wait).
        t0 = time.monotonic()
        assert pool.get(target, config, startup_timeout_s=timeout_s) is handle
        assert time.monotonic() - t0 < 1.0
    print(f"\nnever healthy ({'sleeps' if program is SLEEPER else 'mute'}): {elapsed:.1f} s")
