"""Errors a user can cause, each rendered as one clear ``file:line: message`` line.

Tracebacks are for bugs: everything here is caught by the CLI and printed as text (exit code 2
for bad input, 3 for a target that failed to start).
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Self


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with an input file, at a line (1-based; None when unknown)."""

    file: str
    line: int | None
    message: str

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        return f"{where}: {self.message}".translate(_ONE_LINE)


# Line breaks and other control characters (a YAML key may hold any) shown escaped, so a
# problem is always exactly one line.
_ONE_LINE = {
    code: repr(chr(code))[1:-1]
    for code in (*range(0x20), 0x7F, 0x85, 0x2028, 0x2029)
    if chr(code) != "\t"
}


def _brief_repr() -> reprlib.Repr:
    brief = reprlib.Repr()
    brief.maxstring = brief.maxother = MAX_SHOWN
    brief.maxlong = MAX_SHOWN // 2
    brief.maxlist = brief.maxtuple = brief.maxdict = brief.maxset = 6
    brief.maxlevel = 3
    return brief


MAX_SHOWN = 80  # characters of a key or value a message quotes before eliding the middle
_BRIEF = _brief_repr()


def brief(value: object) -> str:
    """``repr(value)`` with long strings, numbers and collections elided (``...``), so a
    message that quotes a value stays one readable line whatever the file holds."""
    text = _BRIEF.repr(value)
    return text if len(text) <= 3 * MAX_SHOWN else text[: 3 * MAX_SHOWN - 3] + "..."


def shown(text: str) -> str:
    """``text`` as it is when every character of it shows (printable, with plain spaces only
    between other characters) and it is short, else quoted with escapes (``brief``): a key
    named in a message never prints as nothing (``'\\xa0'``, ``'\\t'``, ``'\\u200b'``,
    ``''``) nor as a screenful."""
    if text and len(text) <= MAX_SHOWN and text.isprintable() and text.strip(" ") == text:
        return text
    return brief(text)


class ParityError(Exception):
    """Base class of the harness's user-facing errors."""


class InputError(ParityError):
    """An input file that cannot be used; ``str()`` is one ``file:line: message`` per problem."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        if not self.problems:
            raise ValueError(f"{type(self).__name__} needs at least one problem")
        super().__init__("\n".join(str(p) for p in self.problems))

    @classmethod
    def at(cls, file: str, line: int | None, message: str) -> Self:
        return cls([Problem(file, line, message)])


class ScenarioError(InputError):
    """A scenario file that cannot be used."""


class ProjectError(InputError):
    """A project file (``parity.toml``) that cannot be used."""


class TargetSpecError(ParityError):
    """An unknown or malformed ``--target`` value."""


class NoSchedulerTier(TargetSpecError):
    """A server-only target named at the scheduler tier: its scheduler scenarios are
    UNSUPPORTED there (``parity.runner.unsupported_result``), never an error of the run."""


class TargetStartError(ParityError):
    """A target refused to start with the scenario's config (the message says why)."""
