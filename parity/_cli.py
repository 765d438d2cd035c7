"""What the command modules (``parity.*_cli``) share. Upstream: none."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any


def guarded(
    func: Callable[[argparse.Namespace], Any], error: type[Exception], exit_code: int
) -> Callable[[argparse.Namespace], int]:
    """``func`` with an ``error`` turned into one line on stderr (``parity <command>: ...``)
    and ``exit_code``: the user's mistake, not a traceback."""

    def run(args: argparse.Namespace) -> int:
        try:
            return int(func(args))
        except error as exc:
            sys.stderr.write(f"parity {args.command}: {exc}\n")
            return exit_code

    return run
