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
on: ``[engine, oracle]``). Globs: ``*`` any run of characters (dots included), ``?`` one
character, everything else literal (``steps[46]`` is literal). A divergence's signature is the
one ``parity.causes.classify_all`` gives: consequences folded into their root's signature.

A divergence is named by its ref ``<scenario-id>:<signature>:<path>`` (``divergence_ref``);
``parity decide REF --diverge|--mirror|--bug --reason TEXT [--pair LEFT RIGHT]`` records a
decision for it and the pair it was taken on (by default the pair of the ref's finding in
``reports/last-run.json``, else engine vs oracle), editing the YAML in place with ruamel.yaml
round-trip so comments and order are kept.

Modules: ``schema`` (the file's models, loading, globs), ``classify`` (refs, verdicts, entry
states), ``edit`` (``decide``'s in-place edit), ``render`` (pure ``format_*``), ``cli``
(``parity ledger`` / ``parity decide``, run files). Everything public is importable from here.
"""

from __future__ import annotations

from parity.ledger.classify import (
    DivergenceRef,
    EntryResult,
    EntryState,
    Finding,
    LedgerReport,
    Verdict,
    classify,
    divergence_ref,
    exit_code,
    parse_ref,
)
from parity.ledger.cli import (
    add_ledger_commands,
    cmd_decide,
    cmd_ledger,
    finding_pair,
    load_results,
    load_scenarios_for,
)
from parity.ledger.edit import (
    LEDGER_STUB,
    decide,
)
from parity.ledger.render import (
    format_causes,
    format_findings,
    format_ledger,
    rule_id,
)
from parity.ledger.schema import (
    DECISIONS,
    DEFAULT_LAST,
    DEFAULT_LEDGER,
    DEFAULT_PAIR,
    Ledger,
    LedgerEntry,
    LedgerError,
    Match,
    current_pin,
    glob_match,
    load_ledger,
    parse_ledger,
)

__all__ = [
    "DECISIONS",
    "DEFAULT_LAST",
    "DEFAULT_LEDGER",
    "DEFAULT_PAIR",
    "DivergenceRef",
    "EntryResult",
    "EntryState",
    "Finding",
    "LEDGER_STUB",
    "Ledger",
    "LedgerEntry",
    "LedgerError",
    "LedgerReport",
    "Match",
    "Verdict",
    "add_ledger_commands",
    "classify",
    "cmd_decide",
    "cmd_ledger",
    "current_pin",
    "decide",
    "divergence_ref",
    "exit_code",
    "finding_pair",
    "format_causes",
    "format_findings",
    "format_ledger",
    "glob_match",
    "load_ledger",
    "load_results",
    "load_scenarios_for",
    "parse_ledger",
    "parse_ref",
    "rule_id",
]
