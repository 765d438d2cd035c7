"""A protocol worker built on ``contract.worker.serve`` whose backend writes to stdout in every
way a library might (print, logging to stdout, a raw write to fd 1): none of it may reach the
protocol stream. Its scheduler never schedules anything (an idle trace per step)."""

import logging
import os
import sys

from contract.protocol import Started, Startup
from contract.worker import serve
from parity.targets.replay import idle_step


class NoisyBackend:
    def __init__(self) -> None:
        self.steps = 0

    def start(self, config):
        print("print() during start")
        logging.basicConfig(stream=sys.stdout, level=logging.INFO)
        logging.getLogger("noisy").info("logging to sys.stdout during start")
        os.write(1, b"raw write to fd 1 during start\n")
        self.steps = 0
        return Started(("noisy",), Startup())

    def submit(self, request):
        print(f"print() during submit {request.id}")

    def step(self):
        self.steps += 1
        os.write(1, b"raw write to fd 1 during step\n")
        return idle_step(self.steps, None)

    def close(self):
        print("print() during close")


if __name__ == "__main__":
    sys.exit(serve("noisy", NoisyBackend))
