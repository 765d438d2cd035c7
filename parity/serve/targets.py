"""Serve-tier targets: which server to start, with which flags, environment and folder.

A ``--target`` names a target of the project (``parity.project``): the built-ins ``engine``,
``oracle``, ``oracle[unchecked]`` (test-only: the pinned server with its startup capacity check
disabled, for wedge reproductions; never for parity) and ``oracle@VERSION`` (another upstream
release from its own environment), declared in ``parity/defaults.toml``, and a project file's
own ``[targets.NAME]``. All are data (``parity.targets.defs.ServeDef``): a command with
placeholders, an environment, a folder, how the server spells each scenario config key, and
which vLLM extensions it accepts. There is no special path for any of them.

``external:<command>`` (command line only) is an ad-hoc target that speaks vLLM's flags; its
words are split with ``shlex`` (never run through a shell), ``{port}``, ``{model}`` and
``{model_name}`` are replaced, and the server flags go where a ``{flags}`` word is, or at the
end. Any target may be followed by extra server flags, appended after the scenario's:
``engine --divergence legacy-capacity``. A target's label (reports, ledger ``target`` globs)
is its name plus those flags; an external one is ``external:<program>``.

Flags: each key the scenario sets (``ServerConfig.engine_args``) is spelled by the target's
``flags`` table, or the vLLM way when the target has ``vllm_flags``; one it cannot spell makes
the scenario unsupported there (``unsupported_reason``). The harness also asks every target for
what makes servers comparable (``contract.engine_args.HARNESS_ARGS``, float32 unless the
scenario sets a dtype, the served model name); a target that cannot take one just does not get
it.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from contract.engine_args import DEFAULT_DTYPE, HARNESS_ARGS, SERVE_ARGS, vllm_flag
from parity.errors import TargetSpecError
from parity.serve.spec import ServerConfig
from parity.targets.defs import CAPABILITIES, ServeDef, TargetDef, common_placeholders, expand

HOST = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class TargetSpec:
    """A resolved serve-tier ``--target``: its definition, version and extra flags."""

    spec: str  # as given
    name: str  # the target's name (a template's bound name: oracle@0.28.0)
    serve: ServeDef
    extra_flags: tuple[str, ...] = ()
    version: str | None = None  # a template target's {version}
    root: str = field(default_factory=os.getcwd)  # the project folder (default cwd)
    pins: str = ".cache/pins"  # the project's pins folder
    ordinal: int = 1  # the n-th target of a run with this same label (distinct_labels)

    @property
    def label(self) -> str:
        """The name reports and ledgers use: the name plus any extra flags (``#2`` for the
        second target of a run with the same label)."""
        text = " ".join([self.name, *(shlex.quote(f) for f in self.extra_flags)])
        return text if self.ordinal == 1 else f"{text} #{self.ordinal}"

    @property
    def kind(self) -> str:
        """``engine``, ``oracle`` or ``external`` (the name's family; for display only)."""
        head = self.name.split("@", 1)[0].split("[", 1)[0]
        return head if head in ("engine", "oracle") else "external"

    def accepts(self, capability: str) -> bool | None:
        """True / False as declared; None when it is to be probed ("auto")."""
        value = self.serve.capability(capability)
        return None if value == "auto" else bool(value)


def parse_target(spec: str, project: Any = None) -> TargetSpec:
    """Resolve a serve-tier ``--target`` value; ``TargetSpecError`` (one line) if it names no
    target of the project or has no server."""
    from parity.project import current_project

    project = project or current_project()
    text = spec.strip()
    if text.startswith("external:"):
        return _external(spec, text[len("external:") :], project)
    words = _split(text, spec)
    if not words:
        raise TargetSpecError("empty target")
    definition, version = lookup(words[0], project.targets, spec)
    if definition.serve is None:
        raise TargetSpecError(f"target {words[0]!r} has no server (serve tier)")
    return TargetSpec(
        spec=spec,
        name=words[0],
        serve=definition.serve,
        extra_flags=tuple(words[1:]),
        version=version,
        root=str(project.root),
        pins=str(project.pins),
    )


def parse_targets(specs: Sequence[str], project: Any = None) -> list[TargetSpec]:
    """``parse_target`` for each spec of a run, equal labels made distinct (``#2``...), so two
    targets of one pair are never confused."""
    targets: list[TargetSpec] = []
    for spec in specs:
        target = parse_target(spec, project)
        same = sum(1 for t in targets if t.label.split(" #", 1)[0] == target.label)
        targets.append(replace(target, ordinal=same + 1) if same else target)
    return targets


def lookup(
    name: str, targets: Mapping[str, TargetDef], spec: str, tier: str = "serve"
) -> tuple[TargetDef, str | None]:
    """The definition ``name`` refers to, and the version it binds (``name@V`` of a template
    ``name@*``); ``TargetSpecError`` naming the known targets otherwise."""
    if name in targets and not targets[name].template:
        return targets[name], None
    head, at, version = name.partition("@")
    template = targets.get(f"{head}@*")
    if at and version and template is not None:
        if not re.fullmatch(r"[0-9A-Za-z][0-9A-Za-z.+_-]*", version):
            raise TargetSpecError(f"target {spec!r}: {version!r} is not a version")
        return template, version
    named = [n for n, d in targets.items() if d.tier(tier) is not None]
    known = ", ".join(sorted(n.replace("@*", "@VERSION") for n in named))
    extra = ", external:<command with {port}>" if tier == "serve" else ", worker:<command>"
    raise TargetSpecError(f"unknown {tier}-tier target {spec!r} (known: {known}{extra})")


def _external(spec: str, command_text: str, project: Any) -> TargetSpec:
    command = _split(command_text, spec)
    if not command:
        raise TargetSpecError(f"target {spec!r}: external: needs a command")
    if not any("{port}" in word for word in command):
        raise TargetSpecError(f"target {spec!r}: the external command must contain {{port}}")
    serve = ServeDef(
        command=tuple(command),
        env={
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CPU_KVCACHE_SPACE": "{env:VLLM_CPU_KVCACHE_SPACE:-1}",
        },
        vllm_flags=True,
        capabilities={name: True for name in CAPABILITIES if name != "debug_scheduler"},
        port_in_group=False,
    )
    return TargetSpec(
        spec=spec,
        name=f"external:{_program(command)}",
        serve=serve,
        root=os.getcwd(),
        pins=str(project.pins),
    )


def _program(command: list[str]) -> str:
    """A short name for an external command: its program, or the module of ``python -m M``."""
    words = [w for w in command if "{" not in w]
    for index, word in enumerate(words):
        base = Path(word).name
        if base.startswith("python") or base in ("env", "uv", "run", "exec"):
            if index + 2 < len(words) + 1 and words[index + 1 : index + 2] == ["-m"]:
                return words[index + 2] if index + 2 < len(words) else base
            continue
        if not word.startswith("-"):
            return base
    return Path(command[0]).name


# -- flags --------------------------------------------------------------------------------
def config_flags(target: TargetSpec, config: ServerConfig) -> tuple[list[str], str | None]:
    """The server flags for ``config`` on ``target``, and why the target cannot run it (the
    first scenario key it cannot spell), or None."""
    flags, reason, _ = _plan_flags(target, config)
    return flags, reason


def harness_args_taken(target: TargetSpec, config: ServerConfig) -> tuple[str, ...]:
    """The harness's own keys (served_model_name, enforce_eager, ...) the target was given."""
    return _plan_flags(target, config)[2]


def _plan_flags(
    target: TargetSpec, config: ServerConfig
) -> tuple[list[str], str | None, tuple[str, ...]]:
    serve = target.serve
    args = dict(config.engine_args)
    asked = set(args)
    args.setdefault("dtype", DEFAULT_DTYPE)
    flags: list[str] = []
    harness: list[tuple[str, Any]] = [("served_model_name", config.model_name)]
    harness += list(HARNESS_ARGS.items())
    took: list[str] = []
    for key, value in [*((k, args[k]) for k in SERVE_ARGS if k in args), *harness]:
        words = spell(serve, key, value)
        if words is None:
            if key in asked:
                why = f"config key {key}: {target.name} cannot take it ({_why(serve, key)})"
                return flags, why, tuple(took)
            continue
        if key not in asked:
            took.append(key)
        flags += words
    if config.extra_args:
        if not serve.vllm_flags:
            why = (
                f"config key extra_args: vLLM server flags, and {target.name} does not take "
                "vLLM's flags"
            )
            return flags, why, tuple(took)
        flags += list(config.extra_args)
    return flags, None, tuple(took)


def spell(serve: ServeDef, key: str, value: Any) -> list[str] | None:
    """How ``serve`` spells ``key=value`` (None: it cannot)."""
    spelling = serve.flags.get(key)
    if spelling is False:
        return None
    if spelling is None:
        return vllm_flag(key, value) if serve.vllm_flags else None
    if isinstance(spelling, Mapping):
        if not isinstance(value, bool):
            return None
        chosen = spelling.get("true" if value else "false")
        return None if chosen is None else list(chosen)
    text = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return [word.replace("{value}", text) for word in spelling]


def _why(serve: ServeDef, key: str) -> str:
    if serve.flags.get(key) is False:
        return "its flags table says false"
    return "no spelling in its flags table, and it does not take vLLM's flags"


def server_flags(config: ServerConfig) -> list[str]:
    """vLLM ``serve`` flags for ``config`` plus the flags that make targets comparable."""
    flags, _ = config_flags(parse_target("engine"), config)
    return flags


def unsupported_reason(target: TargetSpec, config: ServerConfig) -> str | None:
    """Why ``target`` cannot run ``config`` (a scenario key it cannot take, or a model with no
    GGUF export for a command that takes ``{model_gguf}``), or None."""
    from parity.models import has_gguf

    reason = config_flags(target, config)[1]
    takes_gguf = any("{model_gguf}" in word for word in target.serve.command)
    if reason is None and takes_gguf and not has_gguf(config.model_dir):
        reason = f"model {config.model_name}: {target.name} takes a GGUF file, and it has none"
    return reason


def placeholders(
    target: TargetSpec, config: ServerConfig | None = None, port: int | str = 0
) -> dict[str, str]:
    """The values of every placeholder a target's command, env and folder may use (the model
    ones only with a ``config``)."""
    values = common_placeholders(target.root, target.pins, target.version)
    values |= {"host": HOST, "port": str(port)}
    if config is not None:
        values |= {"model": str(config.model_dir), "model_name": config.model_name}
        if any("{model_gguf}" in word for word in target.serve.command):
            from parity.models import ensure_gguf

            values["model_gguf"] = str(ensure_gguf(config.model_dir))
    return values


def server_argv(target: TargetSpec, config: ServerConfig, port: int | str) -> list[str]:
    """The argv that starts ``target`` with ``config`` on ``port`` (127.0.0.1; a string is put
    in the port's place as it is)."""
    flags, _ = config_flags(target, config)
    flags += list(target.extra_flags)
    values = placeholders(target, config, port)
    argv: list[str] = []
    placed = False
    for word in target.serve.command:
        if word == "{flags}":
            argv.extend(flags)
            placed = True
            continue
        argv.append(_expand(word, values, target))
    return argv if placed else [*argv, *flags]


def server_env(target: TargetSpec, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a target's server runs with: ``base`` (default: ours) plus its own."""
    base = dict(os.environ if base is None else base)
    return base | declared_env(target, base)


def declared_env(target: TargetSpec, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The target's own environment variables, expanded in order (``{env:NAME}`` from ``base``,
    default ours, and the variables expanded before it)."""
    env = dict(os.environ if base is None else base)
    values = placeholders(target)
    own: dict[str, str] = {}
    for name, value in target.serve.env.items():
        own[name] = env[name] = _expand(value, values, target, env).strip(os.pathsep)
    return own


def share_env(target: TargetSpec) -> dict[str, str]:
    """The environment a broker's server of ``target`` gets besides its own (``share.env``,
    expanded like ``env``)."""
    if target.serve.share is None:
        return {}
    values = placeholders(target)
    return {k: _expand(v, values, target) for k, v in target.serve.share.env.items()}


FILE_TARGET_FLAGS = frozenset({"--divergence"})  # engine-only, selects a reproduced bug


def file_target_problem(spec: str) -> str | None:
    """Why a target named in a file (not on the command line) must not run by default, or None.

    An ``external:`` command is a command of the file's choosing; extra flags outside
    ``parity.serve.spec.FILE_FLAGS`` (and ``--divergence``) could load code (vLLM's
    ``--tool-parser-plugin FILE``). Both need ``--allow-external-from-file``. A project-file
    target is the user's own declaration and is trusted like the command line."""
    from parity.serve.spec import refused_flags

    target = parse_target(spec)
    if spec.strip().startswith("external:"):
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


def server_cwd(target: TargetSpec, config: ServerConfig | None = None) -> str:
    """The folder the server starts in: its ``cwd`` (placeholders expanded, the model ones with
    a ``config``; relative to the project) or the project."""
    if target.serve.cwd is None:
        return target.root
    return str(Path(target.root) / _expand(target.serve.cwd, placeholders(target, config), target))


def _expand(
    word: str, values: Mapping[str, str], target: TargetSpec, env: Mapping[str, str] | None = None
) -> str:
    try:
        return expand(word, values, os.environ if env is None else env)
    except KeyError as exc:
        raise TargetSpecError(
            f"target {target.name}: placeholder {{{exc.args[0]}}} has no value here"
        ) from None


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


def _split(text: str, spec: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise TargetSpecError(f"target {spec!r}: {exc}") from None
