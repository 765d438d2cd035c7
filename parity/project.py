"""The project file, ``parity.toml``: where a port keeps its suite, ledger, models and targets.

``find_project()`` looks for ``parity.toml`` in the working directory and its parents (or takes
``--config FILE``); every path in it resolves relative to the file's folder. Without one, the
project is the working directory with the defaults below. The file (docs/project-file.md)::

    [parity]
    scenarios = ["scenarios"]        # default paths of `parity run` (may name @suites)
    ledger = "ledger.yaml"           # the decision ledger (named: must exist)
    models = ".cache/models"         # built models (scripted, random), built on demand
    reports = "reports"              # parity run --report, last-run.json

    [targets.myport]                 # a target: see parity.targets.defs for every key
    command = ["./build/my-server", "--model", "{model}", "--port", "{port}"]

The harness's own targets (``engine``, ``oracle``, ``oracle[unchecked]``, ``oracle@VERSION``)
are declared the same way in the package's ``parity/defaults.toml``; a project file adds its
own next to them (it cannot redefine a built-in name).

Errors are one ``parity.toml:LINE: message`` line each (``ProjectError``, exit 2).
"""

from __future__ import annotations

import functools
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parity.errors import Problem, ProjectError
from parity.targets.defs import TargetDef, parse_targets

PROJECT_FILE = "parity.toml"
DEFAULTS_FILE = Path(__file__).with_name("defaults.toml")
PARITY_KEYS = ("scenarios", "ledger", "models", "reports", "pins")
PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # the folder holding engine/, parity/, ...


@dataclass(frozen=True)
class Project:
    """One project: its folder, its file (None: none found), paths, and its targets."""

    root: Path
    file: Path | None = None
    scenarios: tuple[str, ...] = ()  # paths (absolute) or @suite names
    ledger: Path | None = None  # explicitly named ledger (None: none configured)
    models: Path = Path(".cache/models")
    reports: Path = Path("reports")
    pins: Path = Path(".cache/pins")
    targets: Mapping[str, TargetDef] = field(default_factory=dict)

    @property
    def source(self) -> str:
        return str(self.file) if self.file is not None else f"{self.root} (no {PROJECT_FILE})"

    def model_dir(self, name: str) -> Path:
        """A model folder: a bare name (``scripted``) is a built model of the models folder,
        anything else a path relative to the project."""
        if "/" not in name and "\\" not in name and not name.startswith("."):
            return self.models / name
        return (self.root / name).resolve()

    @property
    def last_run(self) -> Path:
        return self.reports / "last-run.json"


def find_project(start: str | Path | None = None, config: str | Path | None = None) -> Project:
    """The project of ``config`` (a file, must exist), or of the nearest ``parity.toml`` at or
    above ``start`` (default: the working directory), or a default project there."""
    if config is not None:
        path = Path(config)
        if not path.is_file():
            raise ProjectError.at(str(config), None, "no such project file")
        return load_project(path)
    here = Path(start or os.getcwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / PROJECT_FILE
        if candidate.is_file():
            return load_project(candidate)
    return _project(here, None, {}, {})


@functools.lru_cache(maxsize=8)
def _cached(cwd: str) -> Project:
    return find_project(cwd)


def current_project() -> Project:
    """The project of the working directory (cached per directory)."""
    return _cached(os.getcwd())


def load_project(path: str | Path) -> Project:
    """Load and validate a ``parity.toml``."""
    file = Path(path).resolve()
    data, lines = read_toml(file)
    problems: list[Problem] = []
    unknown = sorted(set(data) - {"parity", "targets"})
    problems += [Problem(str(file), lines.get((k,)), f"{k}: unknown table") for k in unknown]
    table = data.get("parity", {})
    if not isinstance(table, dict):
        problems.append(Problem(str(file), lines.get(("parity",)), "parity: must be a table"))
        table = {}
    for key in sorted(set(table) - set(PARITY_KEYS)):
        problems.append(
            Problem(
                str(file),
                lines.get(("parity", key)),
                f"parity.{key}: unknown key (known: {', '.join(PARITY_KEYS)})",
            )
        )
    targets = data.get("targets", {})
    if problems:
        raise ProjectError(problems)
    return _project(file.parent, file, table, targets, lines)


def _project(
    root: Path,
    file: Path | None,
    table: Mapping[str, Any],
    targets: Mapping[str, Any],
    lines: Mapping[tuple[Any, ...], int] | None = None,
) -> Project:
    where = str(file) if file else "<defaults>"
    lines = lines or {}

    def path_of(key: str, default: str | None) -> Path | None:
        value = table.get(key, default)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise ProjectError.at(where, lines.get(("parity", key)), f"parity.{key}: a path")
        return (root / value).resolve()

    scenarios = table.get("scenarios", [])
    if isinstance(scenarios, str):
        scenarios = [scenarios]
    if not isinstance(scenarios, list) or not all(isinstance(s, str) and s for s in scenarios):
        raise ProjectError.at(
            where, lines.get(("parity", "scenarios")), "parity.scenarios: a list of paths"
        )
    builtin = builtin_targets()
    own = parse_targets(targets, where, lines) if targets else {}
    clash = sorted(set(own) & set(builtin))
    if clash:
        raise ProjectError.at(
            where,
            lines.get(("targets", clash[0])),
            f"targets.{clash[0]}: a built-in target's name (choose another)",
        )
    return Project(
        root=root,
        file=file,
        scenarios=tuple(s if s.startswith("@") else str((root / s).resolve()) for s in scenarios),
        ledger=path_of("ledger", None),
        models=path_of("models", ".cache/models") or root / ".cache/models",
        reports=path_of("reports", "reports") or root / "reports",
        pins=path_of("pins", ".cache/pins") or root / ".cache/pins",
        targets={**builtin, **own},
    )


@functools.cache
def builtin_targets() -> dict[str, TargetDef]:
    """The package's own targets (``parity/defaults.toml``)."""
    data, lines = read_toml(DEFAULTS_FILE)
    return parse_targets(data.get("targets", {}), "<package defaults>", lines, builtin=True)


def read_toml(file: Path) -> tuple[dict[str, Any], dict[tuple[Any, ...], int]]:
    """The parsed TOML and the line of each table and key (``toml_lines``)."""
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProjectError.at(str(file), None, f"cannot read: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line = _decode_line(str(exc))
        message = str(exc).split(" (at line", 1)[0]
        raise ProjectError.at(str(file), line, f"invalid TOML: {message}") from None
    return data, toml_lines(text)


def _decode_line(message: str) -> int | None:
    marker = "(at line "
    if marker not in message:
        return None
    digits = message.split(marker, 1)[1].split(",", 1)[0].rstrip(")")
    return int(digits) if digits.isdigit() else None


def toml_lines(text: str) -> dict[tuple[Any, ...], int]:
    """``{(table..., key): line}`` for the tables and keys of a TOML text (1-based lines).

    A small scanner, enough for error locations: table headers (``[a."b.c"]``), dotted and
    quoted keys, inline tables one level deep (``env = { A = "1" }`` gives ``(..., "env",
    "A")``). Values spanning lines are skipped over."""
    found: dict[tuple[Any, ...], int] = {}
    table: tuple[str, ...] = ()
    depth = 0  # open [ or { of a value spanning lines
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if depth:
            depth += _balance(line)
            continue
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            header = line.strip("[]").split("#", 1)[0].strip().rstrip("]").strip()
            table = tuple(_key_parts(header))
            for i in range(1, len(table) + 1):
                found.setdefault(table[:i], number)
            continue
        if "=" not in line:
            continue
        key, _, value = line.partition("=")
        path = (*table, *_key_parts(key.strip()))
        found.setdefault(path, number)
        value = value.strip()
        if value.startswith("{"):
            for inner in _inline_keys(value):
                found.setdefault((*path, inner), number)
        depth = max(_balance(value), 0)
    return found


def _key_parts(key: str) -> list[str]:
    parts, current, quote = [], "", ""
    for char in key:
        if quote:
            if char == quote:
                quote = ""
            else:
                current += char
        elif char in "\"'":
            quote = char
        elif char == ".":
            parts.append(current.strip())
            current = ""
        else:
            current += char
    parts.append(current.strip())
    return [p for p in parts if p]


def _inline_keys(value: str) -> list[str]:
    body = value.strip().lstrip("{").rsplit("}", 1)[0]
    keys = []
    for item in body.split(","):
        if "=" in item:
            keys.append("".join(_key_parts(item.split("=", 1)[0].strip())))
    return keys


def _balance(text: str) -> int:
    """Open minus closed brackets/braces outside strings."""
    depth, quote = 0, ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char == "#":
            break
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
    return depth
