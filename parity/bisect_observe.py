"""One scenario's observation on ``oracle@PIN`` at one tier, cached, and two pins compared.

The observations are the ones ``parity run`` makes: at the scheduler tier ``runner.run_target``
on the ``oracle@PIN`` protocol worker (a ``TargetRun``), at the serve tier
``serve.suite.run_serve_scenarios`` with the pins as its targets (a ``ServeRun`` per pin). Two pins are compared with
the tier's differ (``parity.differ.diff_runs``, ``parity.serve.differ.diff_serve_runs``) and
the divergences classified as ``parity run`` classifies them (``parity.causes.classify_all``).

The scheduler tier applies the release's own startup check here (``CheckedStartup``): a run
whose worker reports that upstream would refuse the config at startup counts as refused, as
that release's server would. Without it, a release that changes only its startup check would
look unchanged at this tier (the scheduler runs anyway there).

Cache: ``.cache/bisect/<tier>/<scenario hash>/<pin>.json``, keyed by a hash of the scenario's
content (not its file name), so a second bisect of the same scenario starts no server or
worker. Each record also holds ``observer_digest(pin)``, a hash of the code that made it (the
oracle adapter, the contract, the targets, the serve tier, the runner) and of the pin's lock;
a record made by other code is observed again. ``--fresh`` ignores the cache.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parity.errors import TargetStartError
from parity.results import Divergence, TargetRun
from parity.scenario import ConfigSpec, Scenario
from parity.serve.run import ServeRun
from parity.targets.base import SchedulerWrapper

Observation = TargetRun | ServeRun
TIERS = ("scheduler", "serve")


def scenario_hash(scenario: Scenario) -> str:
    """A hash of what the scenario says (its file's name and lines play no part)."""
    text = json.dumps(scenario.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


# The harness's own files an observation depends on, relative to the package root.
OBSERVER_FILES = ("oracle/**/*.py", "contract/**/*.py", "parity/targets/**/*.py",
                  "parity/serve/**/*.py", "parity/runner.py", "parity/scenario.py")  # fmt: skip
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def observer_digest(pin: str, root: Path = _PACKAGE_ROOT) -> str:
    """A hash of the harness code that observes and of ``oracle/pins/<pin>.txt`` (if any)."""
    digest = hashlib.sha256()
    files = sorted({f for pattern in OBSERVER_FILES for f in root.glob(pattern) if f.is_file()})
    lock = root / "oracle" / "pins" / f"{pin}.txt"
    for path in [*files, lock] if lock.is_file() else files:
        digest.update(path.relative_to(root).as_posix().encode("utf-8") + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def target_name(pin: str) -> str:
    return f"oracle@{pin}"


class ObservationStore:
    """Observations by (scenario, pin, tier), on disk under ``root``."""

    def __init__(self, root: Path, *, fresh: bool = False) -> None:
        self.root = root
        self.fresh = fresh
        self.made: list[tuple[str, str, str]] = []  # (scenario id, pin, tier) run, not cached
        self._memory: dict[tuple[str, str, str], Observation] = {}

    def path(self, scenario: Scenario, pin: str, tier: str) -> Path:
        return self.root / tier / scenario_hash(scenario) / f"{pin}.json"

    def get(self, scenario: Scenario, pin: str, tier: str) -> Observation | None:
        key = (scenario_hash(scenario), pin, tier)
        if key in self._memory:
            return self._memory[key]
        path = self.path(scenario, pin, tier)
        if self.fresh or not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("observer") != observer_digest(pin):
                return None  # made by other harness code or another lock: observed again
            kind = TargetRun if tier == "scheduler" else ServeRun
            observation = kind.from_json(data["observation"])
        except (OSError, ValueError, KeyError, TypeError):
            return None  # unreadable (e.g. written by an older harness): observed again
        self._memory[key] = observation
        return observation

    def put(self, scenario: Scenario, pin: str, tier: str, observation: Observation) -> None:
        self._memory[(scenario_hash(scenario), pin, tier)] = observation
        self.made.append((scenario.id, pin, tier))
        path = self.path(scenario, pin, tier)
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "scenario_id": scenario.id,
            "pin": pin,
            "tier": tier,
            "observer": observer_digest(pin),
            "observation": observation.to_json(),
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record) + "\n", encoding="utf-8")
        tmp.replace(path)

    def observe(
        self,
        wanted: dict[str, list[Scenario]],
        tier: str,
        project: Any = None,
        log_dir: Path | None = None,
    ) -> None:
        """Make every (pin, scenario) observation of ``wanted`` that is not cached."""
        missing = {
            pin: [s for s in scenarios if self.get(s, pin, tier) is None]
            for pin, scenarios in wanted.items()
        }
        missing = {pin: scenarios for pin, scenarios in missing.items() if scenarios}
        if not missing:
            return
        runner = observe_scheduler if tier == "scheduler" else observe_serve
        by_id = {s.id: s for scenarios in missing.values() for s in scenarios}
        for (scenario_id, pin), observation in runner(missing, project, log_dir):
            self.put(by_id[scenario_id], pin, tier, observation)  # kept as soon as made


class CheckedStartup(SchedulerWrapper[Any]):
    """A scheduler-tier target with the release's startup check applied: ``start`` raises
    ``TargetStartError`` when the target's own check (``startup``, the protocol's ``Startup``)
    refuses the config."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = str(inner.name)

    @property
    def notes(self) -> list[str]:
        return list(getattr(self.inner, "notes", ()))

    def start(self, config: ConfigSpec) -> None:
        self.inner.start(config)
        check = getattr(self.inner, "startup", None)
        if check is not None and check.refused:
            self.inner.close()
            raise TargetStartError(f"startup check refused: {check.message}")

    def shutdown(self) -> None:
        from parity.targets import shutdown_targets

        shutdown_targets([self.inner])


def observe_scheduler(
    wanted: dict[str, list[Scenario]], project: Any = None, log_dir: Path | None = None
) -> Iterator[tuple[tuple[str, str], TargetRun]]:
    """Each (pin, scenario) on the ``oracle@PIN`` protocol worker: one worker per pin, for
    all of its scenarios (``runner.run_target``)."""
    from parity.runner import run_target
    from parity.targets import make_target

    for pin, scenarios in wanted.items():
        target = CheckedStartup(make_target(target_name(pin), "scheduler", project))
        try:
            for scenario in scenarios:
                yield (scenario.id, pin), run_target(scenario, target, project)
        finally:
            target.shutdown()


def observe_serve(
    wanted: dict[str, list[Scenario]], project: Any = None, log_dir: Path | None = None
) -> Iterator[tuple[tuple[str, str], ServeRun]]:
    """Each (pin, scenario) on that release's server, through ``parity run``'s serve path
    (``serve.suite.run_serve_scenarios``): the scenarios of one server config that need the
    same pins run in one session with those pins as its targets (one server per pin, the
    next started while the current one runs; a one-sided timing difference is run again on
    fresh servers). One session per config, so each config's runs are kept as they end."""
    from parity.serve.suite import group_by_config, run_serve_scenarios

    pins_of: dict[str, list[str]] = {}
    scenario_of: dict[str, Scenario] = {}
    for pin, scenarios in wanted.items():
        for scenario in scenarios:
            pins_of.setdefault(scenario.id, []).append(pin)
            scenario_of[scenario.id] = scenario
    sessions: dict[tuple[str, ...], list[Scenario]] = {}
    for scenario_id, needed in pins_of.items():
        sessions.setdefault(tuple(needed), []).append(scenario_of[scenario_id])
    for pins, scenarios in sessions.items():
        targets = [target_name(pin) for pin in pins]
        for _config, group in group_by_config(scenarios):
            results = run_serve_scenarios(group, targets, log_dir=log_dir, project=project)
            for scenario, result in zip(group, results, strict=True):
                for pin, run in zip(pins, result.runs, strict=True):
                    assert isinstance(run, ServeRun)
                    yield (scenario.id, pin), run


@dataclass(frozen=True)
class Classified:
    """One divergence between two pins with its signature."""

    divergence: Divergence
    signature: str
    rule: str


def compare(
    scenario: Scenario, tier: str, before: Observation, after: Observation
) -> list[Classified]:
    """The divergences between two observations of ``scenario``, classified."""
    from parity.causes import classify_all
    from parity.differ import diff_runs
    from parity.serve.differ import diff_serve_runs
    from parity.signatures import SignatureContext

    if tier == "scheduler":
        assert isinstance(before, TargetRun) and isinstance(after, TargetRun)
        found = diff_runs(scenario, before, after)
        context = SignatureContext.build(scenario, before.summary, after.summary)
    else:
        assert isinstance(before, ServeRun) and isinstance(after, ServeRun)
        found = diff_serve_runs(scenario, before, after)
        context = SignatureContext.build(scenario, before, after)
    classified = classify_all(found, context)
    return [
        Classified(d, c.signature.value, c.rule) for d, c in zip(found, classified, strict=True)
    ]
