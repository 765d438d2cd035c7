"""``parity decide``'s edit: write or update one entry of a ledger file in place.

ruamel.yaml's round-trip mode keeps comments, key order and quoting; a new entry goes after
the last entry as text (so comments trailing the list stay at the end); the result must load
back (``parse_ledger``) before it replaces the file, atomically.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path as FsPath
from typing import Any

from parity._roundtrip import dump, round_trip, write_atomic
from parity.errors import brief
from parity.ledger.classify import DivergenceRef, parse_ref
from parity.ledger.schema import (
    DECISIONS,
    Ledger,
    LedgerError,
    Match,
    current_pin,
    glob_match,
    parse_ledger,
)

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
    yaml = round_trip()
    doc = yaml.load(text)
    entries = _entries_node(doc)
    if index is None:
        new_id = entry_id or _fresh_id(ledger, target_ref)
        node = _new_node(new_id, target_ref, scope, values)
        if len(entries) and not entries.fa.flow_style():
            # as text after the last entry, so comments trailing the list stay at the end
            out = _insert_after_last_content(
                text, dump(yaml, {"entries": [node]}).split("\n", 1)[1]
            )
        else:
            entries.fa.set_block_style()
            entries.append(node)
            out = dump(yaml, doc)
    else:
        new_id = str(entries[index]["id"])
        _update_node(entries[index], scope, values)
        out = dump(yaml, doc)
    parse_ledger(out, file)  # never write a ledger that does not load back
    write_atomic(path, out)
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
