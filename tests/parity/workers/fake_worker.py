"""A tiny misbehaving protocol worker for the WorkerTarget tests: ``fake_worker.py MODE``.

It answers the protocol well (one request, one line; a one-request scheduler whose every step
finishes nothing) except where ``MODE`` says otherwise:

- ``ok``: behaves; ``crash-at-hello``: a stderr line, exit 3 before answering;
- ``crash-at-step``: a stderr line, exit 7 at the first step;
- ``hang-at-hello`` / ``hang-at-step``: never answers that request;
- ``garbage-at-step``: a line that is not JSON; ``wrong-shape``: a step answer without a trace
  field; ``two-lines``: two lines for one step; ``version-2``: hello answers protocol 2;
- ``spawn-child``: behaves, and leaves a ``sleep`` child in its process group (its pid is the
  hello's ``implementation``).
"""

import json
import os
import subprocess
import sys
import time

MODE = sys.argv[1]
EMPTY_TRACE = {
    "num_scheduled_tokens": {},
    "scheduled_new_req_ids": [],
    "scheduled_resumed_req_ids": [],
    "scheduled_running_req_ids": [],
    "preempted_req_ids": [],
    "finished": {},
    "stop_reasons": {},
    "sampled_token_ids": {},
    "block_ids": {},
    "num_computed_tokens": {},
    "running": [],
    "waiting": [],
    "num_free_blocks": 3,
}


def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def answer(op, state):
    if op == "hello":
        if MODE == "crash-at-hello":
            sys.stderr.write("fake worker: cannot import its scheduler\n")
            sys.stderr.flush()
            sys.exit(3)
        if MODE == "hang-at-hello":
            time.sleep(3600)
        if MODE == "version-2":
            return send({"ok": True, "protocol": 2, "implementation": "fake"})
        implementation = "fake"
        if MODE == "spawn-child":
            implementation = str(subprocess.Popen(["sleep", "600"]).pid)
        return send({"ok": True, "protocol": 1, "implementation": implementation})
    if op == "start":
        state["step"] = 0
        return send({"ok": True, "notes": ["fake note"], "startup": {"refused": False}})
    if op == "step":
        state["step"] += 1
        if MODE == "crash-at-step":
            sys.stderr.write("fake worker: step went wrong\n")
            sys.stderr.flush()
            os._exit(7)
        if MODE == "hang-at-step":
            time.sleep(3600)
        if MODE == "garbage-at-step":
            sys.stdout.write("Traceback (most recent call last): oops\n")
            sys.stdout.flush()
            return None
        if MODE == "wrong-shape":
            return send({"ok": True, "trace": {"step": state["step"]}})
        if MODE == "two-lines":
            sys.stdout.write('{"ok":true,"trace":null}\n{"ok":true}\n')
            sys.stdout.flush()
            return None
        return send({"ok": True, "trace": {"step": state["step"], **EMPTY_TRACE}})
    return send({"ok": True})


def main():
    state = {"step": 0}
    for line in sys.stdin:
        if not line.strip():
            continue
        op = json.loads(line)["op"]
        answer(op, state)
        if op == "exit":
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
