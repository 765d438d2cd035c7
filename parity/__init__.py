"""The parity harness: scenarios, targets, observers, differ, ledger, reports.

The public surface of the scheduler tier is re-exported here; modules whose names
start with ``_`` are private.
"""

from parity.differ import diff_runs
from parity.errors import ParityError, Problem, ScenarioError, TargetSpecError, TargetStartError
from parity.expect import check_expect
from parity.loader import (
    collect_files,
    dump_scenario,
    load_scenario,
    load_scenarios,
    parse_scenario,
    write_scenario,
)
from parity.results import (
    Divergence,
    ExpectFailure,
    RequestOutcome,
    RunReport,
    RunSummary,
    ScenarioResult,
    Status,
    TargetRun,
    Wedge,
)
from parity.runner import run_scenario, run_target
from parity.scenario import (
    ConfigSpec,
    ExpectSpec,
    LimitsSpec,
    RequestSpec,
    Scenario,
    StepExpect,
    json_schema,
)
from parity.targets import (
    SchedulerTarget,
    Target,
    available_targets,
    make_target,
    register_target,
)

__all__ = [
    "ConfigSpec",
    "Divergence",
    "ExpectFailure",
    "ExpectSpec",
    "LimitsSpec",
    "ParityError",
    "Problem",
    "RequestOutcome",
    "RequestSpec",
    "RunReport",
    "RunSummary",
    "Scenario",
    "ScenarioError",
    "ScenarioResult",
    "SchedulerTarget",
    "Status",
    "StepExpect",
    "Target",
    "TargetRun",
    "TargetSpecError",
    "TargetStartError",
    "Wedge",
    "available_targets",
    "check_expect",
    "collect_files",
    "diff_runs",
    "dump_scenario",
    "json_schema",
    "load_scenario",
    "load_scenarios",
    "make_target",
    "parse_scenario",
    "register_target",
    "run_scenario",
    "run_target",
    "write_scenario",
]
