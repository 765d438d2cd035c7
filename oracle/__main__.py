"""``python -m oracle serve MODEL_DIR [vLLM serve flags]``: run the pinned vLLM server."""

from __future__ import annotations

import sys

from oracle.pin import PinMismatchError

USAGE = "usage: python -m oracle serve MODEL_DIR [--host H] [--port P] [vLLM serve flags]"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] != "serve" or len(args) < 2:
        print(USAGE, file=sys.stderr)
        return 2
    from oracle.launcher import FlagError, exec_serve

    try:
        exec_serve(args[1:])
    except PinMismatchError as exc:
        print(f"oracle: {exc}", file=sys.stderr)
        return 1
    except FlagError as exc:
        print(f"oracle: {exc}", file=sys.stderr)
        return 2
    return 0  # not reached: exec_serve replaces the process


if __name__ == "__main__":
    sys.exit(main())
