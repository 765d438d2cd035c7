"""Repro files (``scenarios/hangs/*.repro.yaml``): the schema and the loader.

A repro is a hang report written as legs, like the port's record (docs/failure-classes.md): a
control leg that completes and the suspected wedge, each with its own server config, requests,
limits and expected outcome per target. The ``.repro.yaml`` suffix keeps ``parity run`` from
treating the files as scenarios. Keys::

    id: port-wedge-serve                 # equals the file name without .repro.yaml
    description: ...
    targets: [engine --divergence legacy-capacity, "oracle[unchecked]"]   # default targets
    legs:
      - name: wedge
        role: wedge                      # control | wedge | sigterm | saturation | stall | ...
        sigterm: true                    # SIGTERM while the wedged request is outstanding
        tier: serve                      # or scheduler (parity.runner, in process)
        config: {block_size: 32, num_gpu_blocks_override: 3, max_model_len: 96}
        requests: [{id: r1, prompt_token_ids: [389, 444, 400], max_tokens: 90}]
        limits: {stall_s: 2, request_timeout_s: 60, startup_timeout_s: 300, sigterm_grace_s: 5}
        expect:                          # target label glob -> outcome (or an entry)
          "engine*": zero_byte_hang
          "oracle[unchecked]": {outcome: self_preemption_wedge, sigterm: exited}
          oracle: startup_refused

``config`` and ``requests`` are ``parity.scenario``'s ``ConfigSpec`` / ``RequestSpec`` (vLLM's
names); each leg becomes an in-memory ``Scenario`` (``leg_scenario``) whose ``file:line``
locations point into the repro file. Errors are ``file:line: message`` (``ScenarioError``).
Glob keys use ``*`` and ``?`` only: brackets are literal, so ``oracle[unchecked]`` is exact.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path as FsPath
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    PrivateAttr,
)

from parity._yaml import LineMap, Path, line_of
from parity.errors import brief
from parity.loader import located, raise_problems, read_source, validate_text
from parity.scenario import ConfigSpec, LimitsSpec, RequestSpec, Scenario
from parity.serve.observe import OUTCOMES

SUFFIX = ".repro.yaml"
Role = Literal["control", "wedge", "sigterm", "saturation", "stall", "budget", "clamp", "probe"]
# Verdict classes on top of the client outcomes (parity.serve.observe.OUTCOMES).
CLASSES = ("self_preemption_wedge", "saturation_queueing")
SCHEDULER_OUTCOMES = ("finished", "wedged", "unfinished")
EXPECTABLE = frozenset(OUTCOMES) | frozenset(CLASSES) | frozenset(SCHEDULER_OUTCOMES)
DEFAULT_TARGETS = ("engine", "oracle")
DEFAULT_SIGTERM_GRACE_S = 5.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ReproLimits(_Strict):
    """Bounds of one leg (serve tier: seconds; scheduler tier: steps)."""

    stall_s: PositiveFloat = 2.0
    request_timeout_s: PositiveFloat = 60.0
    startup_timeout_s: PositiveFloat = 300.0
    sigterm_grace_s: PositiveFloat = DEFAULT_SIGTERM_GRACE_S
    poll_s: PositiveFloat = 0.25
    max_steps: PositiveInt = 1000
    stall_steps: PositiveInt = 50
    preemptions_tolerance: NonNegativeInt = Field(
        default=0, description="allowed difference of the preemption count between targets"
    )


class ExpectEntry(_Strict):
    """What one target must show in a leg (every key optional)."""

    outcome: str | None = None  # the leg's verdict class, or every request's outcome
    requests: dict[str, str] = Field(default_factory=dict)  # request id -> outcome or class
    sigterm: Literal["exited", "survived"] | None = None
    finish_reason: Literal["stop", "length", "abort", "error"] | None = None
    content: Literal["null", "present"] | None = None  # completion text or chat content


class Leg(_Strict):
    """One leg: a server config, its requests, limits and expectations."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$", max_length=40)
    role: Role = "probe"
    tier: Literal["serve", "scheduler"] = "serve"
    description: str | None = None
    config: ConfigSpec = Field(default_factory=ConfigSpec)
    requests: list[RequestSpec] = Field(min_length=1)
    limits: ReproLimits = Field(default_factory=ReproLimits)
    expect: dict[str, str | ExpectEntry] = Field(default_factory=dict)
    sigterm: bool = Field(
        default=False,
        description="SIGTERM the server while the leg's stalled requests are still outstanding "
        "(always for role sigterm)",
    )

    @property
    def sends_sigterm(self) -> bool:
        return self.sigterm or self.role == "sigterm"

    def expectation(self, label: str) -> ExpectEntry | None:
        """The entry of the first key matching ``label`` (exact match first, then globs)."""
        for key, value in self.expect.items():
            if key == label:
                return _entry(value)
        for key, value in self.expect.items():
            if glob_match(key, label):
                return _entry(value)
        return None


class Repro(_Strict):
    """One repro file."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$", max_length=100)
    description: str = Field(min_length=1)
    targets: list[str] = Field(default_factory=lambda: list(DEFAULT_TARGETS), min_length=1)
    legs: list[Leg] = Field(min_length=1)

    _file: str = PrivateAttr(default="<memory>")
    _lines: LineMap = PrivateAttr(default_factory=dict)

    @property
    def file(self) -> str:
        return self._file

    def location(self, path: Path) -> str:
        line = line_of(self._lines, path) if self._lines else None
        return self._file if line is None else f"{self._file}:{line}"

    def leg_scenario(self, index: int) -> Scenario:
        """Leg ``index`` as a ``Scenario`` (id ``<repro id>--<leg name>``), located in the file."""
        leg = self.legs[index]
        limits: dict[str, Any] = {"max_steps": leg.limits.max_steps}
        limits["stall_steps"] = leg.limits.stall_steps
        if leg.tier == "serve":
            limits.update(
                stall_s=leg.limits.stall_s,
                request_timeout_s=leg.limits.request_timeout_s,
                startup_timeout_s=leg.limits.startup_timeout_s,
                preemptions_tolerance=leg.limits.preemptions_tolerance,
            )
        scenario = Scenario.model_validate(
            {
                "id": f"{self.id}--{leg.name}",
                "description": leg.description or f"{self.description} (leg {leg.name})",
                "tier": leg.tier,
                "config": leg.config,
                "requests": list(leg.requests),
                "limits": LimitsSpec.model_validate(limits),
            }
        )
        prefix = ("legs", index)
        lines = {p[2:]: n for p, n in self._lines.items() if p[:2] == prefix and len(p) > 2}
        if (*prefix, "name") in self._lines:
            lines[("id",)] = self._lines[(*prefix, "name")]
        scenario.attach_source(self._file, lines)
        return scenario


def glob_match(pattern: str, label: str) -> bool:
    """``*`` and ``?`` are wildcards; everything else (brackets too) is literal."""
    escaped = re.sub(r"([\[\]])", r"[\1]", pattern)
    return fnmatch.fnmatchcase(label, escaped)


def _entry(value: str | ExpectEntry) -> ExpectEntry:
    return ExpectEntry(outcome=value) if isinstance(value, str) else value


def repro_stem(path: str | FsPath) -> str:
    name = FsPath(path).name
    return name[: -len(SUFFIX)] if name.endswith(SUFFIX) else FsPath(path).stem


def load_repro(path: str | FsPath) -> Repro:
    """Load and validate one repro file; ``ScenarioError`` (``file:line: message``) if bad."""
    return parse_repro(read_source(path), str(path), stem=repro_stem(path))


def parse_repro(text: str, file: str, stem: str | None = None) -> Repro:
    repro, lines = validate_text(Repro, text, file, "repro")
    repro._file, repro._lines = file, lines
    raise_problems(located(file, lines, _checks(repro, stem)))
    return repro


def _checks(repro: Repro, stem: str | None) -> list[tuple[Path, str]]:
    found: list[tuple[Path, str]] = []
    if stem is not None and repro.id != stem:
        found.append((("id",), f"{brief(repro.id)} must equal the file name {brief(stem)}{SUFFIX}"))
    names: set[str] = set()
    for i, leg in enumerate(repro.legs):
        where: Path = ("legs", i)
        if leg.name in names:
            found.append(((*where, "name"), f"duplicate leg name {brief(leg.name)}"))
        names.add(leg.name)
        ids: set[str] = set()
        for j, request in enumerate(leg.requests):
            at: Path = (*where, "requests", j)
            if request.id in ids:
                found.append(((*at, "id"), f"duplicate request id {brief(request.id)}"))
            ids.add(request.id)
            forms = [k for k in ("prompt_token_ids", "prompt", "messages") if getattr(request, k)]
            if len(forms) != 1:
                found.append((at, "give exactly one of prompt_token_ids, prompt, messages"))
            if leg.tier == "scheduler" and (
                request.prompt_token_ids is None or not request.max_tokens
            ):
                found.append((at, "the scheduler tier needs prompt_token_ids and max_tokens >= 1"))
        if leg.tier == "scheduler" and leg.config.num_gpu_blocks_override is None:
            found.append(((*where, "config"), "the scheduler tier needs num_gpu_blocks_override"))
        for key, value in leg.expect.items():
            entry = _entry(value)
            spot: Path = (*where, "expect", key)
            for outcome in [entry.outcome, *entry.requests.values()]:
                if outcome is not None and outcome not in EXPECTABLE:
                    found.append(
                        (
                            spot,
                            f"unknown outcome {brief(outcome)} (known: {', '.join(sorted(EXPECTABLE))})",
                        )
                    )
            for rid in entry.requests:
                if rid not in ids:
                    found.append((spot, f"unknown request {brief(rid)}"))
    return found
