"""Targets the runner compares, and the registry that makes them from ``--target`` specs.

``make_target("engine", tier="scheduler")`` returns a fresh target. Specs are registry names
(``engine``, ``oracle``) or ``prefix:argument`` (``engine:/models/scripted``), optionally
followed by flags the target takes (``engine --divergence abort-unservable``: the target's
``configure_flags``; split with shlex). A *command* target takes the whole rest of the spec as
its argument instead (``worker:python -m engine.core.scheduler_worker``: a protocol worker,
``parity/targets/worker.py``). Heavy modules are imported only when their target is made.
"""

from __future__ import annotations

import importlib
import shlex
from collections.abc import Callable
from typing import Any

from parity.errors import NoSchedulerTier, TargetSpecError
from parity.targets.base import TIERS, SchedulerTarget, Target

# factory(argument) -> Target; argument is the text after "name:" ("" when absent)
TargetFactory = Callable[[str], Target]

# Factories registered in code (tests, extensions); the project's targets come after them.
_FACTORIES: dict[tuple[str, str], TargetFactory | str] = {
    ("scheduler", "worker"): "parity.targets.worker:worker_target",
}
# Targets whose argument is everything after "name:" (a command line), never flags.
_COMMAND_TARGETS = {("scheduler", "worker")}


def register_target(tier: str, name: str, factory: TargetFactory | str) -> None:
    """Register ``factory`` (or a ``module:attribute`` path to it) as ``name`` in ``tier``."""
    if tier not in TIERS:
        raise ValueError(f"unknown tier {tier!r}")
    _FACTORIES[(tier, name)] = factory


def available_targets(tier: str, project: Any = None) -> list[str]:
    """Names of the targets that run at ``tier`` (templates shown as ``name@VERSION``)."""
    from parity.project import current_project

    targets = (project or current_project()).targets
    names = {n.replace("@*", "@VERSION") for n, d in targets.items() if d.tier(tier) is not None}
    return sorted(names | {name for (t, name) in _FACTORIES if t == tier})


def lacks_scheduler_tier(spec: str, project: Any = None) -> str | None:
    """Why ``spec`` has no scheduler tier (the text ``make_target`` raises ``NoSchedulerTier``
    with), or None; constructs nothing (an in-process oracle imports vllm when made)."""
    from parity.project import current_project
    from parity.serve.targets import lookup

    name = spec.strip().partition(" ")[0].partition(":")[0]
    if ("scheduler", name) in _FACTORIES:
        return None
    definition, _ = lookup(name, (project or current_project()).targets, spec, "scheduler")
    return _server_only(name) if definition.scheduler is None else None


def _server_only(name: str) -> str:
    return f"target {name!r} has no scheduler tier (a server only)"


def make_target(spec: str, tier: str = "scheduler", project: Any = None) -> Target:
    """A new target for ``spec`` in ``tier``; ``TargetSpecError`` for an unknown spec.

    The name is a project target (``parity.project``; the built-ins ``engine``, ``oracle``,
    ``oracle@VERSION`` among them) or one registered in code; ``name:argument`` passes the
    argument to an in-process target's class (``engine:/models/scripted``)."""
    from parity.project import current_project
    from parity.serve.targets import lookup

    if tier not in TIERS:
        raise TargetSpecError(f"unknown tier {tier!r} (choose from {', '.join(TIERS)})")
    head, _, rest = spec.strip().partition(" ")
    name, _, argument = head.partition(":")
    if (tier, name) in _COMMAND_TARGETS:
        argument, rest = spec.strip()[len(name) + 1 :], ""
    try:
        flags = shlex.split(rest)
    except ValueError as e:
        raise TargetSpecError(f"target {spec!r}: {e}") from None
    project = project or current_project()
    factory = _FACTORIES.get((tier, name))
    if factory is None:
        definition, version = lookup(name, project.targets, spec, tier)
        scheduler = definition.scheduler
        if scheduler is None:
            raise NoSchedulerTier(_server_only(name))
        if scheduler.in_process is None:
            return _worker(name, version, scheduler, flags, project)
        factory = scheduler.in_process
    if isinstance(factory, str):
        module_name, _, attribute = factory.partition(":")
        factory = getattr(importlib.import_module(module_name), attribute)
    target = factory(argument)
    if not argument:
        target.name = name
    if flags:
        configure = getattr(target, "configure_flags", None)
        if configure is None:
            raise TargetSpecError(f"{tier}-tier target {name!r} takes no flags (got {rest!r})")
        configure(flags)
        target.name = " ".join([target.name, *(shlex.quote(f) for f in flags)])
    return target


def _worker(
    name: str, version: str | None, scheduler: Any, flags: list[str], project: Any
) -> Target:
    """A scheduler-tier target that runs ``scheduler.command`` as a protocol worker
    (docs/scheduler-protocol.md), placeholders expanded like a server's."""
    import os

    from parity.targets.defs import common_placeholders, expand
    from parity.targets.worker import WorkerTarget

    if flags:
        raise TargetSpecError(f"scheduler-tier target {name!r} takes no flags (got {flags!r})")
    values = common_placeholders(str(project.root), str(project.pins), version)
    env = dict(os.environ)
    for key, value in scheduler.env.items():
        env[key] = expand(value, values, env).strip(os.pathsep)
    argv = [expand(word, values, env) for word in scheduler.command]
    cwd = str(project.root / scheduler.cwd) if scheduler.cwd else str(project.root)
    timeout = scheduler.startup_timeout_s
    return WorkerTarget(
        name, argv, env=env, cwd=cwd, **({"start_timeout_s": timeout} if timeout else {})
    )


def shutdown_targets(targets: list[Target] | tuple[Target, ...]) -> None:
    """End the processes of targets that own one (a protocol worker's ``shutdown``); the
    others have nothing to end after ``close``."""
    for target in targets:
        shutdown = getattr(target, "shutdown", None)
        if shutdown is not None:
            shutdown()


__all__ = [
    "SchedulerTarget",
    "Target",
    "TargetFactory",
    "available_targets",
    "make_target",
    "register_target",
    "shutdown_targets",
]
