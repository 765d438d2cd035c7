"""Serve-tier targets: which server to start, with which flags and environment.

Target specs (``--target``):

- ``engine``: our server, ``python -m engine serve MODEL --port P [vLLM flags]``.
- ``oracle``: the pinned vLLM server through ``python -m oracle serve`` (``oracle.launcher``).
- ``oracle[unchecked]``: the same with upstream's startup KV capacity check disabled
  (``oracle_env(unchecked=True)``, test-only, for wedge reproductions; never for parity).
- ``external:<command>``: anyone's OpenAI-compatible server. The command is split with
  ``shlex`` (never run through a shell); ``{port}``, ``{model}`` and ``{model_name}`` are
  replaced in each word; the server flags are appended, or put where a ``{flags}`` word is.

``engine`` and ``oracle`` may be followed by extra server flags, e.g.
``engine --divergence legacy-capacity``: they are appended after the scenario's flags.

Both sides get the flags that make them comparable (oracle-cpu.md): ``--enforce-eager``,
``--no-async-scheduling``, ``--dtype float32`` unless the scenario sets a dtype, and
``--served-model-name``; ``VLLM_CPU_KVCACHE_SPACE`` (1 GiB) in the environment.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass
from typing import Any

from parity.errors import TargetSpecError
from parity.serve.spec import CONFIG_FLAG_KEYS, ROOT, ServerConfig

HOST = "127.0.0.1"
KINDS = ("engine", "oracle", "external")
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
KVCACHE_SPACE_GIB = "1"
COMPARABLE_FLAGS = ("--enforce-eager", "--no-async-scheduling")
DEFAULT_DTYPE = "float32"


@dataclass(frozen=True, slots=True)
class TargetSpec:
    """A parsed ``--target`` value."""

    spec: str  # as given
    kind: str  # one of KINDS
    unchecked: bool = False  # oracle[unchecked]
    command: tuple[str, ...] = ()  # external: the command's words (placeholders unexpanded)
    extra_flags: tuple[str, ...] = ()  # engine/oracle: flags after the name

    @property
    def label(self) -> str:
        """The name reports use (``oracle[unchecked]`` is always marked as such)."""
        if self.kind == "external":
            return "external:" + shlex.join(self.command)
        name = "oracle[unchecked]" if self.unchecked else self.kind
        return " ".join([name, *(shlex.quote(f) for f in self.extra_flags)])


def parse_target(spec: str) -> TargetSpec:
    """Parse a serve-tier ``--target`` value; ``TargetSpecError`` (one line) if malformed."""
    text = spec.strip()
    if text.startswith("external:"):
        command = _split(text[len("external:") :], spec)
        if not command:
            raise TargetSpecError(f"target {spec!r}: external: needs a command")
        if not any("{port}" in word for word in command):
            raise TargetSpecError(f"target {spec!r}: the external command must contain {{port}}")
        return TargetSpec(spec=spec, kind="external", command=tuple(command))
    words = _split(text, spec)
    if not words:
        raise TargetSpecError("empty target")
    head, flags = words[0], tuple(words[1:])
    if head in ("engine", "oracle"):
        return TargetSpec(spec=spec, kind=head, extra_flags=flags)
    if head == "oracle[unchecked]":
        return TargetSpec(spec=spec, kind="oracle", unchecked=True, extra_flags=flags)
    raise TargetSpecError(
        f"unknown serve-tier target {spec!r} (known: engine, oracle, oracle[unchecked], "
        "external:<command with {port}>)"
    )


FILE_TARGET_FLAGS = frozenset({"--divergence"})  # engine-only, selects a reproduced bug


def file_target_problem(spec: str) -> str | None:
    """Why a target named in a file (not on the command line) must not run by default, or None.

    An ``external:`` target is a command of the file's choosing; ``engine``/``oracle`` flags
    outside ``parity.serve.spec.FILE_FLAGS`` (and ``--divergence``) could load code (vLLM's
    ``--tool-parser-plugin FILE``). Both need ``--allow-external-from-file``."""
    from parity.serve.spec import refused_flags

    target = parse_target(spec)
    if target.kind == "external":
        return (
            f"target {spec!r}: an external: command from a file runs only with "
            "--allow-external-from-file (or give it with --target)"
        )
    refused = [
        flag
        for flag in refused_flags(target.extra_flags)
        if flag.split("=", 1)[0] not in FILE_TARGET_FLAGS
    ]
    if refused:
        return (
            f"target {spec!r}: flag {refused[0]!r} from a file is refused without "
            "--allow-external-from-file (or give the target with --target)"
        )
    return None


def server_flags(config: ServerConfig) -> list[str]:
    """vLLM ``serve`` flags for ``config`` plus the flags that make targets comparable."""
    args = dict(config.engine_args)
    args.setdefault("dtype", DEFAULT_DTYPE)
    flags: list[str] = []
    for key in CONFIG_FLAG_KEYS:
        flags.extend(_flag(key, args.get(key)))
    flags += ["--served-model-name", config.model_name, *COMPARABLE_FLAGS]
    flags += list(config.extra_args)
    return flags


def server_argv(target: TargetSpec, config: ServerConfig, port: int) -> list[str]:
    """The argv that starts ``target`` with ``config`` on ``port`` (127.0.0.1)."""
    flags = server_flags(config) + list(target.extra_flags)
    model = str(config.model_dir)
    if target.kind == "engine":
        head = [sys.executable, "-m", "engine", "serve", model]
        return [*head, "--host", HOST, "--port", str(port), *flags]
    if target.kind == "oracle":
        from oracle.launcher import serve_command  # no vllm import: only argv building

        return serve_command(model, "--host", HOST, "--port", str(port), *flags)
    values = {"{port}": str(port), "{model}": model, "{model_name}": config.model_name}
    argv: list[str] = []
    placed = False
    for word in target.command:
        if word == "{flags}":
            argv.extend(flags)
            placed = True
            continue
        for placeholder, value in values.items():
            word = word.replace(placeholder, value)
        argv.append(word)
    return argv if placed else [*argv, *flags]


def server_env(target: TargetSpec, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a target's server runs with."""
    if target.kind == "oracle":
        from oracle.launcher import oracle_env

        return oracle_env(base, unchecked=target.unchecked)
    env = dict(os.environ if base is None else base)
    env.update(OFFLINE_ENV)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", KVCACHE_SPACE_GIB)
    if target.kind == "engine":
        parts = [str(ROOT), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
        env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def server_cwd(target: TargetSpec) -> str:
    return str(ROOT) if target.kind != "external" else os.getcwd()


# --- startup logs -------------------------------------------------------------------------

# A log line's prefix: "(EngineCore pid=7) ERROR 11-29 08:15:42 [core.py:1510] " (vLLM's format).
_LOG_PREFIX = re.compile(r"^(?:\([^)]*\)\s*)?(?:[A-Z]+\s+\d\d-\d\d\s+[\d:.]+\s+\[[^\]]*\]\s*)?")
_EXCEPTION = re.compile(r"^((?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception)): (\S.*)$")
_USAGE_ERROR = re.compile(r"^(\S[^:]*: error: .*)$")
_WRAPPERS = ("Engine core initialization failed", "See root cause above")
_NUMBERS = {
    "estimated_max_model_len": re.compile(r"estimated maximum model length is (\d+)"),
    "max_seq_len": re.compile(r"max seq len \((\d+)\)"),
    "auto_fit_max_model_len": re.compile(r"[Aa]uto-fit max_model_len: reduced from \d+ to (\d+)"),
    "num_gpu_blocks_override": re.compile(r"with num_gpu_blocks_override=(\d+)"),
}
ADDRESS_IN_USE = ("Address already in use", "[Errno 98]")


def startup_error_line(log: str) -> str | None:
    """The key line of a refused startup: the root exception (``ValueError: ...``), not the
    wrappers that follow it, or an argument error; else the log's last non-empty line."""
    fallback: str | None = None
    for raw in log.splitlines():
        line = raw.rstrip()
        if not line:
            continue
        fallback = line.strip()
        body = _LOG_PREFIX.sub("", line, count=1)
        match = _EXCEPTION.match(body)
        if match and not any(w in match.group(2) for w in _WRAPPERS):
            return f"{match.group(1)}: {match.group(2)}"
        usage = _USAGE_ERROR.match(body)
        if usage:
            return usage.group(1).strip()
    return fallback


def startup_numbers(log: str) -> dict[str, int]:
    """Key numbers in a startup log (estimated max model length, auto-fit result, ...)."""
    found: dict[str, int] = {}
    for name, pattern in _NUMBERS.items():
        match = pattern.search(log)
        if match:
            found[name] = int(match.group(1))
    return found


def _flag(key: str, value: Any) -> list[str]:
    name = "--" + key.replace("_", "-")
    if value is None:
        return []
    if isinstance(value, bool):
        return [name] if value else ["--no-" + key.replace("_", "-")]
    text = str(value)
    return [f"{name}={text}"] if text.startswith("-") else [name, text]


def _split(text: str, spec: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise TargetSpecError(f"target {spec!r}: {exc}") from None
