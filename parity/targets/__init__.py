"""Targets the runner compares, and the registry that makes them from ``--target`` specs.

``make_target("engine", tier="scheduler")`` returns a fresh target. Specs are registry names
(``engine``, ``oracle``) or ``prefix:argument`` (``external:python -m engine serve ...``, serve
tier, issue 6). Heavy modules are imported only when their target is made.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from parity.errors import TargetSpecError
from parity.targets.base import TIERS, SchedulerTarget, Target

# factory(argument) -> Target; argument is the text after "name:" ("" when absent)
TargetFactory = Callable[[str], Target]

_FACTORIES: dict[tuple[str, str], TargetFactory | str] = {
    ("scheduler", "engine"): "parity.targets.engine:EngineTarget",
    ("scheduler", "oracle"): "parity.targets.oracle:OracleTarget",
}


def register_target(tier: str, name: str, factory: TargetFactory | str) -> None:
    """Register ``factory`` (or a ``module:attribute`` path to it) as ``name`` in ``tier``."""
    if tier not in TIERS:
        raise ValueError(f"unknown tier {tier!r}")
    _FACTORIES[(tier, name)] = factory


def available_targets(tier: str) -> list[str]:
    return sorted(name for (t, name) in _FACTORIES if t == tier)


def make_target(spec: str, tier: str = "scheduler") -> Target:
    """A new target for ``spec`` in ``tier``; ``TargetSpecError`` for an unknown spec."""
    if tier not in TIERS:
        raise TargetSpecError(f"unknown tier {tier!r} (choose from {', '.join(TIERS)})")
    name, _, argument = spec.partition(":")
    factory = _FACTORIES.get((tier, name))
    if factory is None:
        known = ", ".join(available_targets(tier)) or "none"
        raise TargetSpecError(f"unknown {tier}-tier target {spec!r} (known: {known})")
    if isinstance(factory, str):
        module_name, _, attribute = factory.partition(":")
        factory = getattr(importlib.import_module(module_name), attribute)
    target = factory(argument)
    if not argument:
        target.name = spec
    return target


__all__ = [
    "SchedulerTarget",
    "Target",
    "TargetFactory",
    "available_targets",
    "make_target",
    "register_target",
]
