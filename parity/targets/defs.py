"""Target definitions: the ``[targets.NAME]`` tables of a project file, parsed and resolved.

A target is one program the harness compares, declared as data (docs/project-file.md)::

    [targets.tfserve]
    command = ["transformers", "serve", "{model}", "--host", "{host}", "--port", "{port}"]
    health = "/health"                  # readiness path (bounded wait: startup_timeout_s)
    startup_timeout_s = 300
    env = { HF_HUB_OFFLINE = "1" }
    [targets.tfserve.flags]             # how this server spells each scenario config key
    block_size = ["--cb-block-size", "{value}"]
    max_model_len = false               # it cannot take it: such scenarios are UNSUPPORTED
    [targets.tfserve.capabilities]      # vLLM extensions it accepts; "auto": probed once
    return_token_ids = false

The flat form (``command`` at the top) is one tier: ``tier = "serve"`` (default) or
``"scheduler"`` (``command`` starts a worker speaking docs/scheduler-protocol.md). A target for
both tiers uses sub-tables ``[targets.NAME.serve]`` and ``[targets.NAME.scheduler]`` (the
latter may name a Python class to run in-process, ``in_process = "module:Class"``, as the
built-ins do). ``vllm_flags = true`` spells every key without an entry in ``flags`` the way
vLLM does (``--block-size 32``); otherwise such a key is unsupported. A name ending in ``@*``
is a template: ``--target oracle@0.28.0`` binds ``{version}``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from parity.errors import Problem

TIERS = ("serve", "scheduler")
# Request fields that are vLLM's extensions to the OpenAI API, plus the server's /metrics:
# the capabilities a target may lack (a scenario that needs one it lacks is UNSUPPORTED there).
REQUEST_EXTENSIONS = (
    *("ignore_eos", "min_tokens", "stop_token_ids", "priority", "top_k", "min_p"),
    *("repetition_penalty", "include_stop_str_in_output", "skip_special_tokens"),
    *("return_token_ids", "include_reasoning", "chat_template_kwargs"),
    *("bad_words", "allowed_token_ids", "truncate_prompt_tokens", "repetition_detection"),
    *("thinking_token_budget", "use_beam_search", "length_penalty"),
)
CAPABILITIES = ("metrics", "debug_scheduler", *REQUEST_EXTENSIONS)
# Placeholders a command, env value or cwd may use ({value} only in flags).
PLACEHOLDERS = frozenset(
    {"python", "host", "port", "model", "model_name", "model_gguf", "package_root"}
    | {"project", "pathsep", "version", "pin_python", "pin_path"}
)
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_TARGET_KEYS = frozenset(
    {"description", "tier", "vllm_flags", "command", "health", "startup_timeout_s", "env"}
    | {"cwd", "flags", "capabilities", "serve", "scheduler", "in_process"}
)
_SERVE_KEYS = frozenset(
    {"command", "health", "startup_timeout_s", "env", "cwd", "flags", "capabilities", "share"}
)
_SHARE_KEYS = frozenset({"env", "reset"})
_SCHEDULER_KEYS = frozenset({"command", "in_process", "env", "cwd", "startup_timeout_s"})

Spelling = tuple[str, ...] | Literal[False] | Mapping[str, tuple[str, ...]]
Capability = bool | Literal["auto"]
_T = TypeVar("_T")


@dataclass(frozen=True)
class ShareDef:
    """How a server broker may lend one server of this target to run after run
    (``parity.serve.broker``): extra environment for the servers it starts, and the POST paths
    that put a server back in a fresh server's state between runs (each must answer 200, and
    ``{"success": false}`` fails it)."""

    env: Mapping[str, str] = field(default_factory=dict)
    reset: tuple[str, ...] = ()


@dataclass(frozen=True)
class ServeDef:
    """How to start a target's server and talk to it."""

    command: tuple[str, ...]
    health: str = "/health"
    startup_timeout_s: float | None = None  # None: the scenario's limit (default 240 s)
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None  # None: the project folder
    flags: Mapping[str, Spelling] = field(default_factory=dict)
    vllm_flags: bool = False
    capabilities: Mapping[str, Capability] = field(default_factory=dict)
    port_in_group: bool = True  # its process group listens on {port} (external: may not)
    share: ShareDef | None = None  # None: a broker never lends its servers to another run

    def capability(self, name: str) -> Capability:
        """Declared value, else true for a vLLM-flag target's extensions, else "auto"."""
        return self.capabilities.get(name, "auto")


@dataclass(frozen=True)
class SchedulerDef:
    """How to run a target's scheduler: a worker command, or a Python class in-process."""

    command: tuple[str, ...] = ()
    in_process: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    startup_timeout_s: float | None = None


@dataclass(frozen=True)
class TargetDef:
    """One ``[targets.NAME]`` table."""

    name: str
    source: str  # "parity.toml:12" or "<package defaults>"
    description: str = ""
    serve: ServeDef | None = None
    scheduler: SchedulerDef | None = None

    @property
    def template(self) -> bool:
        return self.name.endswith("@*")

    def tier(self, tier: str) -> ServeDef | SchedulerDef | None:
        return self.serve if tier == "serve" else self.scheduler


class _Problems:
    def __init__(self, file: str, lines: Mapping[tuple[Any, ...], int]) -> None:
        self.file, self.lines = file, lines
        self.found: list[Problem] = []

    def add(self, path: tuple[Any, ...], message: str) -> None:
        line = None
        for cut in range(len(path), 0, -1):
            if path[:cut] in self.lines:
                line = self.lines[path[:cut]]
                break
        self.found.append(Problem(self.file, line, f"{_dotted(path)}: {message}"))


def parse_targets(
    tables: Mapping[str, Any],
    file: str,
    lines: Mapping[tuple[Any, ...], int],
    *,
    builtin: bool = False,
) -> dict[str, TargetDef]:
    """Validate ``[targets.*]`` tables; ``ProjectError`` listing every problem."""
    from parity.errors import ProjectError

    problems = _Problems(file, lines)
    found: dict[str, TargetDef] = {}
    if not isinstance(tables, Mapping):
        problems.add(("targets",), "must be a table of targets")
        raise ProjectError(problems.found)
    for name, table in tables.items():
        where = ("targets", name)
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-\[\]]*(@\*)?", name):
            problems.add(where, "a target name is letters, digits, _ . - (and @* for a template)")
            continue
        if not isinstance(table, Mapping):
            problems.add(where, "must be a table")
            continue
        definition = _target(name, table, problems, where, builtin)
        line = lines.get(where)
        if definition is not None:
            found[name] = TargetDef(
                name=name,
                source=f"{file}:{line}" if line else file,
                description=str(table.get("description", "")),
                serve=definition[0],
                scheduler=definition[1],
            )
    if problems.found:
        raise ProjectError(problems.found)
    return found


def _target(
    name: str, table: Mapping[str, Any], problems: _Problems, where: tuple[Any, ...], builtin: bool
) -> tuple[ServeDef | None, SchedulerDef | None] | None:
    for key in sorted(set(table) - _TARGET_KEYS):
        problems.add((*where, key), f"unknown key (known: {', '.join(sorted(_TARGET_KEYS))})")
    vllm_flags = table.get("vllm_flags", False)
    if not isinstance(vllm_flags, bool):
        problems.add((*where, "vllm_flags"), "must be true or false")
    tier = table.get("tier")
    flat = {k: v for k, v in table.items() if k in _SERVE_KEYS | _SCHEDULER_KEYS}
    serve_table, scheduler_table = table.get("serve"), table.get("scheduler")
    if flat and tier not in (None, *TIERS):
        problems.add((*where, "tier"), f"must be one of {', '.join(TIERS)}")
        return None
    if flat and (tier or "serve") == "serve":
        serve_table = {**flat, **(serve_table or {})}
    elif flat:
        scheduler_table = {**flat, **(scheduler_table or {})}
    shared = {k: table[k] for k in ("flags", "capabilities") if k in table and not flat}
    serve = scheduler = None
    flat_tier = (tier or "serve") if flat else None  # the flat form's keys sit at `where`
    if serve_table is not None:
        here = where if flat_tier == "serve" else (*where, "serve")
        serve = _serve({**shared, **serve_table}, problems, here, bool(vllm_flags), builtin)
    if scheduler_table is not None:
        here = where if flat_tier == "scheduler" else (*where, "scheduler")
        scheduler = _scheduler(scheduler_table, problems, here)
    if serve is None and scheduler is None and not problems.found:
        problems.add(where, "needs a command (or [serve] / [scheduler] tables)")
    return serve, scheduler


def _serve(
    table: Mapping[str, Any],
    problems: _Problems,
    where: tuple[Any, ...],
    vllm_flags: bool,
    builtin: bool,
) -> ServeDef | None:
    for key in sorted(set(table) - _SERVE_KEYS):
        problems.add((*where, key), "unknown key for a server")
    command = _words(table.get("command"), problems, (*where, "command"))
    if not command:
        return None
    if not any("{port}" in word for word in command):
        problems.add((*where, "command"), "must contain {port} (the harness picks a free port)")
    health = table.get("health", "/health")
    if not isinstance(health, str) or not health.startswith("/"):
        problems.add((*where, "health"), "a path starting with /")
    capabilities = _capabilities(table.get("capabilities", {}), problems, (*where,))
    if builtin:
        capabilities = {name: capabilities.get(name, True) for name in CAPABILITIES}
    return ServeDef(
        command=command,
        health=health if isinstance(health, str) else "/health",
        startup_timeout_s=_seconds(table.get("startup_timeout_s"), problems, where),
        env=_env(table.get("env", {}), problems, (*where, "env")),
        cwd=_text(table.get("cwd"), problems, (*where, "cwd")),
        flags=_flags(table.get("flags", {}), problems, where),
        vllm_flags=vllm_flags,
        capabilities=capabilities,
        share=_share(table["share"], problems, (*where, "share")) if "share" in table else None,
    )


def _share(value: Any, problems: _Problems, where: tuple[Any, ...]) -> ShareDef | None:
    if not isinstance(value, Mapping):
        problems.add(where, 'a table: { env = { NAME = "value" }, reset = ["/path"] }')
        return None
    for key in sorted(set(value) - _SHARE_KEYS):
        problems.add((*where, key), f"unknown key (known: {', '.join(sorted(_SHARE_KEYS))})")
    reset = value.get("reset", [])
    if not isinstance(reset, list) or not all(
        isinstance(p, str) and p.startswith("/") for p in reset
    ):
        problems.add((*where, "reset"), "a list of paths starting with /")
        reset = []
    return ShareDef(env=_env(value.get("env", {}), problems, (*where, "env")), reset=tuple(reset))


def _scheduler(
    table: Mapping[str, Any], problems: _Problems, where: tuple[Any, ...]
) -> SchedulerDef | None:
    for key in sorted(set(table) - _SCHEDULER_KEYS):
        problems.add((*where, key), "unknown key for a scheduler-tier target")
    in_process = table.get("in_process")
    if in_process is not None and (not isinstance(in_process, str) or ":" not in in_process):
        problems.add((*where, "in_process"), "a 'module:Class' path")
        in_process = None
    command = (
        _words(table.get("command"), problems, (*where, "command")) if "command" in table else ()
    )
    if not command and in_process is None:
        problems.add(where, "needs a command (a worker) or in_process")
        return None
    return SchedulerDef(
        command=command,
        in_process=in_process,
        env=_env(table.get("env", {}), problems, (*where, "env")),
        cwd=_text(table.get("cwd"), problems, (*where, "cwd")),
        startup_timeout_s=_seconds(table.get("startup_timeout_s"), problems, where),
    )


def _words(value: Any, problems: _Problems, where: tuple[Any, ...]) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(w, str) for w in value):
        problems.add(where, "a non-empty list of strings (argv, never run through a shell)")
        return ()
    for word in value:
        _check_placeholders(word, problems, where)
    return tuple(value)


def _env(value: Any, problems: _Problems, where: tuple[Any, ...]) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        problems.add(where, 'a table of NAME = "value" strings')
        return {}
    for name, text in value.items():
        _check_placeholders(text, problems, (*where, name))
    return dict(value)


def _text(value: Any, problems: _Problems, where: tuple[Any, ...]) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        problems.add(where, "a non-empty string")
        return None
    _check_placeholders(value, problems, where)
    return value


def _seconds(value: Any, problems: _Problems, where: tuple[Any, ...]) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        problems.add((*where, "startup_timeout_s"), "a positive number of seconds")
        return None
    return float(value)


def _flags(value: Any, problems: _Problems, where: tuple[Any, ...]) -> dict[str, Spelling]:
    from contract.engine_args import SERVE_ARGS

    known = (*SERVE_ARGS, "served_model_name", "enforce_eager", "async_scheduling", "extra_args")
    return _keyed_table(
        value,
        problems,
        (*where, "flags"),
        "a table of config key = [words] | false",
        known=known,
        unknown="not a scenario config key",
        parse=_spelling,
        invalid='a list of words with {value} (e.g. ["--cb-block-size", "{value}"]), false '
        "(cannot take it), or { true = [...], false = [...] } for a switch",
    )


def _spelling(value: Any) -> Spelling | None:
    """One ``flags`` entry, or None when it is none of the three forms."""
    if value is False:
        return False
    if isinstance(value, list) and all(isinstance(w, str) for w in value):
        return tuple(value)
    if (
        isinstance(value, Mapping)
        and set(value) <= {"true", "false"}
        and all(isinstance(v, list) and all(isinstance(w, str) for w in v) for v in value.values())
    ):
        return {k: tuple(v) for k, v in value.items()}
    return None


def _capabilities(value: Any, problems: _Problems, where: tuple[Any, ...]) -> dict[str, Capability]:
    return _keyed_table(
        value,
        problems,
        (*where, "capabilities"),
        'a table of capability = true | false | "auto"',
        known=CAPABILITIES,
        unknown="unknown capability",
        parse=_capability,
        invalid='must be true, false or "auto"',
    )


def _capability(value: Any) -> Capability | None:
    return value if value is True or value is False or value == "auto" else None


def _keyed_table(
    value: Any,
    problems: _Problems,
    where: tuple[Any, ...],
    expected: str,
    *,
    known: Sequence[str],
    unknown: str,
    parse: Callable[[Any], _T | None],
    invalid: str,
) -> dict[str, _T]:
    """A table at ``where`` whose keys are among ``known`` and whose entries ``parse`` reads
    (None: not valid). ``expected`` says what a bad table should have been, ``unknown`` what a
    key outside ``known`` is, ``invalid`` what a bad entry should have been."""
    if not isinstance(value, Mapping):
        problems.add(where, expected)
        return {}
    found: dict[str, _T] = {}
    for key, entry in value.items():
        if key not in known:
            problems.add((*where, key), f"{unknown} (known: {', '.join(known)})")
        elif (parsed := parse(entry)) is not None:
            found[key] = parsed
        else:
            problems.add((*where, key), invalid)
    return found


def _check_placeholders(text: str, problems: _Problems, where: tuple[Any, ...]) -> None:
    for name in _PLACEHOLDER.findall(text):
        if name not in PLACEHOLDERS and not name.startswith("env:"):
            problems.add(
                where,
                f"unknown placeholder {{{name}}} (known: "
                f"{', '.join('{' + p + '}' for p in sorted(PLACEHOLDERS))}, {{env:NAME}})",
            )


def common_placeholders(root: str, pins: str, version: str | None) -> dict[str, str]:
    """The placeholders every tier's command, env and folder may use (``{version}`` and the
    pin's environment only for a bound template)."""
    import os
    import sys

    from parity.project import PACKAGE_ROOT

    values = {
        "python": sys.executable,
        "package_root": str(PACKAGE_ROOT),
        "project": root,
        "pathsep": os.pathsep,
    }
    if version is not None:
        values |= pin_placeholders(version, pins)
    return values


def pin_placeholders(version: str, pins: str) -> dict[str, str]:
    """``{version}``, ``{pin_python}`` and ``{pin_path}`` (the ``PYTHONPATH`` a process of that
    release needs: oracle/_site and the shim of the harness's oracle and contract packages)
    of an installed pin; ``TargetStartError`` when it is not installed."""
    import os

    from parity.errors import TargetStartError
    from parity.pins import PINS_DIR_ENV, PinError, pin_runtime

    saved = os.environ.get(PINS_DIR_ENV)
    os.environ[PINS_DIR_ENV] = pins
    try:
        python, env = pin_runtime(version, {})
    except PinError as exc:
        raise TargetStartError(str(exc)) from None
    finally:
        if saved is None:
            os.environ.pop(PINS_DIR_ENV, None)
        else:
            os.environ[PINS_DIR_ENV] = saved
    return {"version": version, "pin_python": str(python), "pin_path": env.get("PYTHONPATH", "")}


def expand(text: str, values: Mapping[str, str], environ: Mapping[str, str]) -> str:
    """``text`` with every ``{name}`` replaced (``{env:NAME}``: ``environ``'s, or empty;
    ``{env:NAME:-DEFAULT}``: or ``DEFAULT``)."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name.startswith("env:"):
            variable, _, default = name[4:].partition(":-")
            return environ.get(variable) or default
        if name not in values:
            raise KeyError(name)
        return values[name]

    return _PLACEHOLDER.sub(one, text)


def _dotted(path: tuple[Any, ...]) -> str:
    parts = []
    for part in path:
        text = str(part)
        parts.append(text if re.fullmatch(r"[A-Za-z0-9_-]+", text) else f'"{text}"')
    return ".".join(parts)
