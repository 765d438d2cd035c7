"""A tiny misbehaving OpenAI-like server for the serve-tier observer tests (stdlib only).

``python fake_server.py --port P [any vLLM flags]`` answers ``/health``, ``/v1/models`` (the
``--served-model-name`` and ``--max-model-len`` it was given), ``/metrics``
(``vllm:generation_tokens_total`` and friends) and ``POST /v1/completions``, whose *prompt*
string picks a behaviour:

- ``ok``: 5 tokens (streamed as SSE when ``stream``), ``finish_reason "length"``;
- ``stall``: streaming: 3 token frames, then silence (connection kept open);
- ``hang``: nothing at all (no status line), connection kept open;
- ``headers-hang``: streaming: 200 and headers, then silence;
- ``cut``: streaming: 2 token frames, then the connection is closed mid-body;
- ``generate``: non-streaming: 4 s of "generation" (the token counter moves), then the body;
- ``drip``: streaming: one token every 0.3 s, forever;
- ``slow``: non-streaming: 2 s of silence (its metrics say the request runs), then the body;
- ``draw``: non-streaming: one "sampled" token, ``t<K>`` (id 100 + K): K is ``--draw K``, or a
  new random number for every request with ``--draw random`` (a server whose unseeded draws
  depend on more than the request, as a real one's do on which requests shared its steps);
- ``busy``: like ``hang``, but its metrics say the request is running (a slow server, not a
  wedged one: the harness waits out its confirmation window before it calls a stall).

While a ``hang``, ``headers-hang`` or ``stall`` request is open, ``/metrics`` shows it waiting
with nothing running, as a wedged vLLM scheduler does.

On SIGTERM it exits at once, unless ``--slow-exit S``: it stops accepting connections (its
``/health`` no longer answers) and exits S seconds later, as a server that shuts down slowly on a
busy machine does; or ``--ignore-sigterm``: it keeps serving, as the port's wedged server did;
``--ignore-sigterm-once MARKER``: the same, in the first server that finds no MARKER file (it
creates it), so a rerun on a fresh server exits (a one-off slow moment).

``--strict`` makes it an OpenAI-only server, like servers that are not vLLM: a request body
with a key outside the OpenAI API gets 422 (``STANDARD_FIELDS``), answers carry no token ids,
and there is no ``/metrics``. ``GET /argv`` returns the command-line words it was started with
(tests check how a target spelled its flags). ``POST /reset_prefix_cache`` answers like vLLM's
dev route: ``{"success": false}`` while a request is open, else true (and
``fake:prefix_cache_resets_total`` counts it). Every request's method and path is logged to
stderr (tests check which endpoints the harness polled).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import signal
import sys

COUNTERS = {"generation": 0, "waiting": 0, "running": 0, "resets": 0}
WEDGED_MODES = ("hang", "headers-hang", "stall")
FLAGS: dict[str, str] = {}
ARGV: list[str] = []
STRICT = {"on": False}
DRAW: dict[str, str] = {"k": "0"}  # --draw
STANDARD_FIELDS = frozenset(
    {"model", "prompt", "messages", "max_tokens", "max_completion_tokens", "stream"}
    | {"stream_options", "temperature", "top_p", "n", "stop", "seed", "logprobs"}
    | {"top_logprobs", "echo", "presence_penalty", "frequency_penalty", "user"}
)


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _frame(index: int, finish: str | None = None) -> bytes:
    choice: dict[str, object] = {"index": 0, "text": f" t{index}"}
    if not STRICT["on"]:
        choice["token_ids"] = [100 + index]
    choice.update(finish_reason=finish, stop_reason=None)
    return b"data: " + json.dumps({"object": "text_completion", "choices": [choice]}).encode()


# One request per connection, said in every answer: without it a client may reuse a connection
# this server has already closed and lose the request ("server disconnected") on a busy machine.
CLOSE = "connection: close\r\n"


async def _send_json(writer: asyncio.StreamWriter, status: int, body: object) -> None:
    data = json.dumps(body).encode()
    head = f"HTTP/1.1 {status} OK\r\n{CLOSE}content-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n"
    writer.write(head.encode() + data)
    await writer.drain()


async def _start_sse(writer: asyncio.StreamWriter) -> None:
    head = f"HTTP/1.1 200 OK\r\n{CLOSE}content-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    writer.write(head.encode())
    await writer.drain()


async def _token(writer: asyncio.StreamWriter, index: int, finish: str | None = None) -> None:
    COUNTERS["generation"] += 1
    writer.write(_chunk(_frame(index, finish) + b"\n\n"))
    await writer.drain()


async def _completions(writer: asyncio.StreamWriter, body: dict) -> None:
    mode, stream = body.get("prompt"), bool(body.get("stream"))
    print(f"request {mode}", flush=True)  # tests wait for this line in the server's log
    gauge = "waiting" if mode in WEDGED_MODES else "running" if mode in ("busy", "slow") else None
    if gauge is not None:
        COUNTERS[gauge] += 1
    try:
        await _answer(writer, mode, stream)
    finally:
        if gauge is not None:
            COUNTERS[gauge] -= 1


async def _answer(writer: asyncio.StreamWriter, mode: object, stream: bool) -> None:
    if mode in ("hang", "busy"):
        await asyncio.sleep(3600)
    if mode == "slow":
        await asyncio.sleep(2.0)
    if mode == "generate":
        for _ in range(20):
            await asyncio.sleep(0.2)
            COUNTERS["generation"] += 1
    if mode == "draw":
        k = secrets.randbelow(10**9) if DRAW["k"] == "random" else int(DRAW["k"])
        choice = {"index": 0, "text": f" t{k}", "finish_reason": "length", "token_ids": [100 + k]}
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        await _send_json(writer, 200, {"choices": [choice], "usage": usage})
        return
    if not stream:
        choice = {"index": 0, "text": " t0 t1", "finish_reason": "length"}
        if not STRICT["on"]:
            choice["token_ids"] = [100, 101]
        usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
        await _send_json(writer, 200, {"choices": [choice], "usage": usage})
        return
    await _start_sse(writer)
    if mode == "headers-hang":
        await asyncio.sleep(3600)
    count = {"ok": 5, "stall": 3, "cut": 2}.get(mode, 10**6)
    for index in range(count):
        if mode == "drip":
            await asyncio.sleep(0.3)
        await _token(writer, index, "length" if mode == "ok" and index == count - 1 else None)
    if mode == "stall":
        await asyncio.sleep(3600)
    if mode == "cut":
        writer.transport.abort()
        return
    writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    await writer.drain()


def _metrics() -> str:
    lines = [
        "# TYPE vllm:generation_tokens counter",
        f'vllm:generation_tokens_total{{engine="0",model_name="fake"}} {COUNTERS["generation"]}.0',
        "# TYPE vllm:num_requests_running gauge",
        f'vllm:num_requests_running{{engine="0",model_name="fake"}} {COUNTERS["running"]}.0',
        "# TYPE vllm:num_requests_waiting gauge",
        f'vllm:num_requests_waiting{{engine="0",model_name="fake"}} {COUNTERS["waiting"]}.0',
        f"fake:prefix_cache_resets_total {COUNTERS['resets']}.0",
    ]
    return "\n".join(lines) + "\n"


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        request_line, *header_lines = head.decode().split("\r\n")
        method, path, _ = request_line.split(" ", 2)
        headers = dict(h.split(": ", 1) for h in header_lines if ": " in h)
        length = int(headers.get("content-length") or headers.get("Content-Length") or 0)
        body = json.loads(await reader.readexactly(length)) if length else {}
        extra = sorted(set(body) - STANDARD_FIELDS) if isinstance(body, dict) else []
        print(f"request {method} {path}", file=sys.stderr, flush=True)
        if path == "/health":
            await _send_json(writer, 200, {})
        elif path == "/argv":
            await _send_json(writer, 200, ARGV)

        elif STRICT["on"] and path == "/metrics":
            await _send_json(writer, 404, {"error": {"message": "not found", "code": 404}})
        elif STRICT["on"] and method == "POST" and extra:
            detail = [
                {"loc": ["body", key], "msg": "Extra inputs are not permitted"} for key in extra
            ]
            await _send_json(writer, 422, {"detail": detail})
        elif method == "POST" and path == "/reset_prefix_cache":  # as vLLM's dev route
            idle = COUNTERS["running"] == 0 and COUNTERS["waiting"] == 0
            COUNTERS["resets"] += idle
            await _send_json(writer, 200, {"success": idle})
        elif path == "/metrics":
            data = _metrics().encode()
            writer.write(
                f"HTTP/1.1 200 OK\r\n{CLOSE}content-length: {len(data)}\r\n\r\n".encode() + data
            )
        elif path == "/v1/models":
            name = FLAGS.get("--served-model-name", "fake")
            entry = {"id": name, "max_model_len": int(FLAGS.get("--max-model-len", "0"))}
            await _send_json(writer, 200, {"object": "list", "data": [entry]})
        elif method == "POST" and path == "/v1/completions":
            await _completions(writer, body)
        else:
            await _send_json(writer, 404, {"error": {"message": "not found", "code": 404}})
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def main(port: int, slow_exit_s: float | None, ignore_sigterm: bool) -> None:
    server = await asyncio.start_server(handle, "127.0.0.1", port)
    loop = asyncio.get_running_loop()
    if ignore_sigterm:
        loop.add_signal_handler(signal.SIGTERM, lambda: print("SIGTERM ignored", flush=True))
    elif slow_exit_s is not None:

        def shut_down_slowly() -> None:
            server.close()  # no new connections: the readiness path stops answering
            print(f"SIGTERM: exiting in {slow_exit_s} s", flush=True)
            loop.call_later(slow_exit_s, sys.exit, 0)

        loop.add_signal_handler(signal.SIGTERM, shut_down_slowly)
    print(f"fake server on {port} with {FLAGS}", flush=True)
    async with server:
        try:
            await server.serve_forever()
        except asyncio.CancelledError:  # closed by shut_down_slowly: wait for the exit
            await asyncio.sleep(3600)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--strict", action="store_true")
    parser.add_argument("--draw", default="0")
    parser.add_argument("--slow-exit", type=float, default=None)
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--ignore-sigterm-once", metavar="MARKER", default=None)
    args, rest = parser.parse_known_args()
    if args.ignore_sigterm_once is not None:  # the first server started with MARKER only
        try:
            with open(args.ignore_sigterm_once, "x"):
                args.ignore_sigterm = True
        except FileExistsError:
            pass
    STRICT["on"] = args.strict
    DRAW["k"] = args.draw
    ARGV.extend(sys.argv[1:])
    for i, word in enumerate(rest):
        if word.startswith("--") and i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            FLAGS[word] = rest[i + 1]
    try:
        asyncio.run(main(args.port, args.slow_exit, args.ignore_sigterm))
    except KeyboardInterrupt:
        sys.exit(0)
