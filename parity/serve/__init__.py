"""The serve tier: real servers (``engine``, ``oracle``, ``oracle[unchecked]``, ``external:``),
driven over HTTP and observed per request and per target.

- ``spec``: ``ServerConfig``, ``ServeRequestSpec``, ``ServeLimits`` and ``from_scenario``.
- ``targets``: target specs, server flags and environment, startup-log extraction.
- ``pool``: ``ServerPool`` (one server per distinct config, reused, reaped with a record).
- ``observe`` / ``monitor`` / ``client``: the observations, the per-target poller, one request.
- ``run``: ``run_serve`` / ``run_requests`` / ``run_scenario`` -> ``ServeRun``.
Imported from their modules (they build on ``parity.results``, which imports ``ServeRun``):
- ``differ``: ``diff_serve_runs`` (two ``ServeRun``s -> ``Divergence``s); ``expect``:
  ``check_serve_expect``; ``suite``: ``run_serve_scenarios`` (grouped by server config, one
  server up at a time), ``judge`` (runs -> ``ScenarioResult``), ``startup_failed`` (exit 3).
"""

from parity.serve.observe import OUTCOMES, RequestObservation
from parity.serve.pool import ServerHandle, ServerPool, StartupRecord
from parity.serve.run import ServeRun, TargetFacts, run_requests, run_scenario, run_serve
from parity.serve.spec import ServeLimits, ServerConfig, ServeRequestSpec, from_scenario
from parity.serve.targets import TargetSpec, parse_target, server_flags

__all__ = [
    "OUTCOMES",
    "RequestObservation",
    "ServeLimits",
    "ServeRequestSpec",
    "ServeRun",
    "ServerConfig",
    "ServerHandle",
    "ServerPool",
    "StartupRecord",
    "TargetFacts",
    "TargetSpec",
    "from_scenario",
    "parse_target",
    "run_requests",
    "run_scenario",
    "run_serve",
    "server_flags",
]
