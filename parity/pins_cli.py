"""``parity pins``: list, install and prune the oracle pins' environments (``parity.pins``).

    parity pins                              every pin: version, installed, size, python
    parity pins install VERSION|all [--timeout S]
    parity pins prune [VERSION ...]          remove envs (default: all but the default pin)
    parity pins check [VERSION ...]          serve the scripted model on each installed pin

A failure is one line on stderr and exit code 3; nothing half-installed is left behind.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from parity import pins
from parity._cli import guarded
from parity.pins import PinError

EXIT_OK = 0
EXIT_PIN_FAILED = 3


def format_install(result: Any) -> str:
    """The closing line of one ``parity pins install VERSION``."""
    if result.skipped:
        return f"pin {result.version}: {result.skipped} ({result.folder})\n"
    source = " from the uv cache (index unreachable)" if result.offline else ""
    size = pins.format_size(result.size_bytes)
    return (
        f"pin {result.version}: installed{source} in {result.seconds:.1f} s, {size}, "
        f"at {result.folder}\n"
    )


def _cmd_list(args: argparse.Namespace) -> int:
    sys.stdout.write(pins.format_pins(pins.list_pins(), pins.pins_root()))
    return EXIT_OK


def _cmd_install(args: argparse.Namespace) -> int:
    from parity.pins_install import install

    versions = pins.available() if args.versions == ["all"] else args.versions
    failed = 0
    for version in versions:
        began = time.monotonic()

        def progress(message: str, version: str = version, began: float = began) -> None:
            sys.stdout.write(f"pin {version} [{time.monotonic() - began:5.1f} s]: {message}\n")
            sys.stdout.flush()

        try:
            result = install(version, timeout_s=args.timeout, progress=progress)
        except PinError as exc:
            sys.stderr.write(f"parity pins: pin {version}: {exc}\n")
            failed += 1
            continue
        sys.stdout.write(format_install(result))
    return EXIT_PIN_FAILED if failed else EXIT_OK


def _cmd_prune(args: argparse.Namespace) -> int:
    removed = pins.prune(args.versions)
    for version in removed:
        sys.stdout.write(f"pin {version}: removed {pins.env_dir(version)}\n")
    if not removed:
        sys.stdout.write("nothing to prune\n")
    return EXIT_OK


def _cmd_check(args: argparse.Namespace) -> int:
    from parity.pins_check import check_serve, format_check

    installed = [p.version for p in pins.list_pins(sizes=False) if p.installed]
    versions = args.versions or installed
    log_dir = pins.pins_root() / "_logs"
    failed = 0
    for version in versions:
        sys.stdout.write(f"pin {version}: starting its server\n")
        sys.stdout.flush()
        try:
            check = check_serve(version, log_dir)
        except PinError as exc:
            sys.stderr.write(f"parity pins: {exc}\n")
            failed += 1
            continue
        sys.stdout.write(format_check(check))
        failed += not check.ok
    return EXIT_PIN_FAILED if failed else EXIT_OK


def _guarded(func: Any) -> Any:
    return guarded(func, PinError, EXIT_PIN_FAILED)


def add_pins_commands(subparsers: Any) -> None:
    """Register ``parity pins`` (list), ``pins install`` and ``pins prune``."""
    from parity.pins_install import DEFAULT_TIMEOUT_S

    parser = subparsers.add_parser("pins", help="oracle pins: one env per upstream release")
    parser.set_defaults(func=_guarded(_cmd_list))
    sub = parser.add_subparsers(dest="pins_command")
    install = sub.add_parser("install", help="install pins from oracle/pins/VERSION.txt")
    install.add_argument("versions", nargs="+", metavar="VERSION|all")
    install.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds per pin, everything included (default {DEFAULT_TIMEOUT_S:.0f})",
    )
    install.set_defaults(func=_guarded(_cmd_install))
    prune = sub.add_parser("prune", help="remove installed pin envs")
    prune.add_argument("versions", nargs="*", metavar="VERSION")
    prune.set_defaults(func=_guarded(_cmd_prune))
    check = sub.add_parser("check", help="serve the scripted model on installed pins")
    check.add_argument("versions", nargs="*", metavar="VERSION")
    check.set_defaults(func=_guarded(_cmd_check))
