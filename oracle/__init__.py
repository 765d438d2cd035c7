"""The pinned upstream vLLM, driven two ways.

- ``oracle.launcher``: its real OpenAI server as a subprocess (serve tier).
- ``oracle.scheduler_adapter``: its ``Scheduler`` in-process with a scripted fake runner
  (scheduler tier).

This package is the only code in the project that imports ``vllm``; every entry point that
does checks the pin first (``oracle.pin.check_installed``).
"""

from oracle.pin import VERSION, PinMismatchError, check_installed

__all__ = ["VERSION", "PinMismatchError", "check_installed"]
