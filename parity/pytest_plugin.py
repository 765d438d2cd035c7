"""pytest plugin: ``pytest scenarios/`` runs every scenario file as a test item.

Collection: each ``*.yaml`` below a folder named ``scenarios`` that the loader's one rule takes
(``parity.loader.is_scenario_name``: not ``ledger.yaml``, not a ``*.repro.yaml`` hang
reproduction, not named ``_*``) is a ``ScenarioFile``; it yields one
``ScenarioItem`` per tier the scenario declares (``[scheduler]`` / ``[serve]`` suffixes for
``tier: both``). A file that does not load is one item that fails with the loader's
``file:line: message`` lines (no traceback).

Running: scheduler-tier items run the targets in-process (``parity.runner``); serve-tier items
share one ``ServerPool`` per session (per xdist worker: ports are OS-assigned, so ``-n 2``
does not clash). Serve items are ordered by server config, so each config starts once per
target per session; when the config changes, the previous config's servers are stopped (one
config's servers up at a time per worker). With xdist, ``--dist loadgroup`` keeps each config
on one worker (serve items carry ``xdist_group`` marks). Each result is classified against the
decision ledger; an item fails on a NEW divergence, a STALE entry of its scenario, an
``expect:`` failure, or a target that could not run it. The failure text lists each divergence
at its scenario ``file:line`` with the ledger hint.

Options: ``--parity-target SPEC`` (repeatable; default ``engine`` and ``oracle``),
``--parity-ledger FILE`` (default: the ledger of the project file, ``parity.toml``, at or
above the rootdir).

Registration: as a ``pytest11`` entry point (``parity = "parity.pytest_plugin"``), or
``-p parity.pytest_plugin``; ``scenarios/conftest.py`` registers it when neither did (then
the ``--parity-*`` options are not available: they are parsed before a conftest can add them).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from parity.errors import ParityError

DEFAULT_TARGETS = ("engine", "oracle")
SCENARIO_DIR = "scenarios"
SERVE_TIMEOUT_S = 900
SCHEDULER_TIMEOUT_S = 300
_POOL = pytest.StashKey[Any]()
_ACTIVE = pytest.StashKey[str]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("parity", "vllm-parity scenarios")
    group.addoption(
        "--parity-target",
        action="append",
        default=None,
        help="target spec for scenario items (repeatable; default: engine and oracle)",
    )
    group.addoption(
        "--parity-ledger", default=None, help="decision ledger (default: scenarios/ledger.yaml)"
    )


def pytest_configure(config: pytest.Config) -> None:
    for marker in (
        "server: starts an HTTP server subprocess",
        "oracle: uses the pinned upstream vLLM",
        "xdist_group(name): keep items of one server config on one xdist worker",
    ):
        config.addinivalue_line("markers", marker)


def pytest_collect_file(parent: pytest.Collector, file_path: Path) -> pytest.Collector | None:
    from parity.loader import is_scenario_name

    if SCENARIO_DIR not in file_path.parts[:-1] or not is_scenario_name(file_path):
        return None
    return ScenarioFile.from_parent(parent, path=file_path)


class ScenarioFile(pytest.File):
    """One scenario file."""

    def collect(self) -> Iterator[pytest.Item]:
        from parity.loader import load_scenario

        try:
            scenario = load_scenario(self.path)
        except ParityError as exc:
            yield BadScenarioItem.from_parent(self, name=self.path.stem, error=str(exc))
            return
        tiers = ["scheduler", "serve"] if scenario.tier == "both" else [scenario.tier]
        for tier in tiers:
            name = scenario.id if len(tiers) == 1 else f"{scenario.id}[{tier}]"
            item = ScenarioItem.from_parent(self, name=name, scenario=scenario, tier=tier)
            if tier == "serve":
                item.add_marker(pytest.mark.server)
                item.add_marker(pytest.mark.timeout(SERVE_TIMEOUT_S))
                item.add_marker(pytest.mark.xdist_group(item.config_group))
            else:
                item.add_marker(pytest.mark.timeout(SCHEDULER_TIMEOUT_S))
            if "oracle" in " ".join(_targets(self.config)):
                item.add_marker(pytest.mark.oracle)
            yield item


class BadScenarioItem(pytest.Item):
    """A scenario file that does not load: fails with its ``file:line: message`` lines."""

    def __init__(self, *, error: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.error = error

    def runtest(self) -> None:
        raise ScenarioFailure(self.error)

    def repr_failure(self, excinfo: Any, style: Any = None) -> str:
        if isinstance(excinfo.value, ScenarioFailure):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"scenario file {self.path.name}"


class ScenarioFailure(Exception):
    """A scenario item's failure text (divergences at file:line, ledger findings)."""


class ScenarioItem(pytest.Item):
    """One scenario at one tier, run on the configured targets and checked on the ledger."""

    def __init__(self, *, scenario: Any, tier: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scenario = scenario
        self.tier = tier
        self.plan = _plan(self.config, scenario) if tier == "serve" else None
        self.config_group = _config_group(self.plan) if self.plan is not None else "scheduler"

    def runtest(self) -> None:
        from parity.format import format_details
        from parity.ledger import EntryState, Verdict, classify, format_findings, load_ledger
        from parity.results import Status

        result = self._run_scheduler() if self.tier == "scheduler" else self._run_serve()
        path = _ledger_path(self.config)
        ledger = load_ledger(path) if path is not None else load_ledger("(none)", missing_ok=True)
        report = classify([result], ledger, {self.scenario.id: self.scenario})
        new = [f for f in report.findings if f.verdict is Verdict.NEW]
        stale = [e for e in report.entries if e.state is EntryState.STALE]
        if new or stale or result.expect_failures or result.status is Status.ERROR:
            text = format_details([result]) + format_findings(report)
            raise ScenarioFailure(text.rstrip("\n"))

    def _run_scheduler(self) -> Any:
        from parity.runner import run_scenario
        from parity.targets import make_target, shutdown_targets

        project = _project(self.config)
        targets = [make_target(spec, "scheduler", project) for spec in _targets(self.config)]
        try:
            result, _runs = run_scenario(self.scenario, targets, project)  # type: ignore[arg-type]
        finally:
            shutdown_targets(targets)
        return result

    def _run_serve(self) -> Any:
        from parity.serve.suite import ServePlan, confirmed, judge, run_plan, suspect
        from parity.serve.targets import parse_targets

        pool = _pool(self.config)
        _switch_config(self.config, pool, self.config_group)
        project = _project(self.config)
        plan = self.plan or ServePlan.of(self.scenario, project)
        targets = parse_targets(_targets(self.config), project)
        first = judge(self.scenario, [run_plan(pool, target, plan) for target in targets])
        if not suspect(first):
            return first
        # a one-sided timing difference: confirmed on freshly started servers first
        again = [run_plan(pool, target, plan, fresh=True) for target in targets]
        return confirmed(first, judge(self.scenario, again))

    def repr_failure(self, excinfo: Any, style: Any = None) -> str:
        if isinstance(excinfo.value, ScenarioFailure | ParityError):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        line = self.scenario.line_of(("id",))
        return self.path, (line - 1) if line else None, f"scenario {self.name} ({self.tier})"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Serve items grouped by server config (stable: file order within a config)."""
    order: dict[str, int] = {}
    for item in items:
        if isinstance(item, ScenarioItem) and item.tier == "serve":
            order.setdefault(item.config_group, len(order))
    if not order:
        return
    positions = [i for i, item in enumerate(items) if _is_serve(item)]
    serve = sorted((items[i] for i in positions), key=lambda it: order[it.config_group])  # type: ignore[attr-defined]
    for index, item in zip(positions, serve, strict=True):
        items[index] = item


def pytest_unconfigure(config: pytest.Config) -> None:
    pool = config.stash.get(_POOL, None)
    if pool is not None:
        pool.close()


def _is_serve(item: pytest.Item) -> bool:
    return isinstance(item, ScenarioItem) and item.tier == "serve"


def _targets(config: pytest.Config) -> list[str]:
    return list(config.getoption("parity_target", default=None) or DEFAULT_TARGETS)


def _project(config: pytest.Config) -> Any:
    """The project of the test session: the nearest ``parity.toml`` at or above its rootdir."""
    return _project_at(str(config.rootpath))


@functools.lru_cache(maxsize=4)
def _project_at(rootpath: str) -> Any:
    from parity.project import find_project

    return find_project(rootpath)


def _ledger_path(config: pytest.Config) -> Path | None:
    option = config.getoption("parity_ledger", default=None)
    return Path(option) if option else _project(config).ledger


def _pool(config: pytest.Config) -> Any:
    from parity.serve.pool import ServerPool

    pool = config.stash.get(_POOL, None)
    if pool is None:
        pool = ServerPool()
        config.stash[_POOL] = pool
    return pool


def _switch_config(config: pytest.Config, pool: Any, group: str) -> None:
    """Stop the servers of the previous config when a new one begins (bounded memory)."""
    if config.stash.get(_ACTIVE, None) not in (None, group):
        for handle in pool.handles:
            handle.stop(pool.grace_s)
    config.stash[_ACTIVE] = group


def _plan(config: pytest.Config, scenario: Any) -> Any:
    from parity.serve.suite import ServePlan

    return ServePlan.of(scenario, _project(config))


def _config_group(plan: Any) -> str:
    return "parity-serve-" + hashlib.sha1(plan.key.encode()).hexdigest()[:10]
