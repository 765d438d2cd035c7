"""The ``parity`` command line.

Subcommands are thin: they parse flags, call the library, print what pure ``format_*`` functions
return, and map outcomes to exit codes (0 parity or known, 1 new or stale divergences, 2 bad
input, 3 a target failed to start when it should have).
"""

from __future__ import annotations

import argparse
import sys

EXIT_OK = 0
EXIT_DIVERGENCE = 1
EXIT_BAD_INPUT = 2
EXIT_TARGET_FAILED = 3


def _cmd_model_build(args: argparse.Namespace) -> int:
    from engine.scripted.builder import build

    files = build(args.variant, args.out, seed=args.seed)
    for name, digest in sorted(files.items()):
        print(f"{digest}  {name}")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="parity", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    model = sub.add_parser("model", help="build the scripted test models")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    build_p = model_sub.add_parser("build", help="build a model folder (deterministic)")
    build_p.add_argument("--variant", choices=["scripted", "random"], required=True)
    build_p.add_argument("--out", required=True, help="output folder")
    build_p.add_argument("--seed", type=int, default=0, help="random variant seed")
    build_p.set_defaults(func=_cmd_model_build)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
