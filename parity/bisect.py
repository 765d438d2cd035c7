"""Bisection over upstream releases: which adjacent pins a scenario's behaviour changes between.

A *pin* is an upstream release with a lock in ``oracle/pins/`` (``parity.pins``). The behaviour
of a scenario at a pin is its observation on ``oracle@PIN`` at one tier
(``parity.bisect_observe``); two pins *differ* when the existing differ reports divergences
between their observations.

The assumption: when the two ends of a range of pins behave the same, nothing changed inside
it (a change and its revert inside one range go unseen). When they differ, the range is split
at its middle pin and both halves are checked, down to adjacent pairs: each adjacent pair that
differs is one change, and its second pin is the first release with the new behaviour. So a
scenario that behaves the same at both ends of the range costs two observations, and one change
among ``n`` pins about ``2 + 2 log2 n``.

``Bisection`` is the search for one scenario, advanced one round at a time so that the
observations every open scenario needs in a round can be made together (one server or worker
per pin and round); ``bisect_all`` drives several of them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from oracle.launcher import version_key
from parity.errors import ParityError

K = TypeVar("K", bound=Hashable)


class RangeError(ParityError):
    """A ``--pins`` value that names no usable range (exit 2)."""


def parse_pins(text: str, available: Sequence[str]) -> list[str]:
    """The pins of ``A..B`` (every locked release from A to B, inclusive, in version order) or
    of a comma list ``A,B,C`` (sorted by version); ``RangeError`` unless at least two known
    pins result."""
    known = sorted(available, key=version_key)
    listed = ", ".join(known) or "none"
    text = text.strip()
    if ".." in text:
        low, _, high = text.partition("..")
        ends = [low.strip(), high.strip()]
        for end in ends:
            if end not in known:
                raise RangeError(f"--pins {text}: no lock for {end!r} (known pins: {listed})")
        if version_key(ends[0]) >= version_key(ends[1]):
            raise RangeError(f"--pins {text}: the range must go from an older to a newer pin")
        first, last = known.index(ends[0]), known.index(ends[1])
        return known[first : last + 1]
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise RangeError(f"--pins {text}: no lock for {', '.join(unknown)} (known pins: {listed})")
    pins = sorted(set(names), key=version_key)
    if len(pins) < 2:
        raise RangeError(f"--pins {text}: name at least two pins (A..B or A,B,...)")
    return pins


@dataclass
class Bisection:
    """The bisection of one scenario over ``pins`` (oldest first)."""

    pins: tuple[str, ...]
    open: list[tuple[int, int]] = field(default_factory=list)  # index ranges still to decide
    changes: list[tuple[str, str]] = field(default_factory=list)  # adjacent pairs that differ
    compared: list[tuple[str, str]] = field(default_factory=list)  # every comparison made

    def __post_init__(self) -> None:
        if len(self.pins) < 2:
            raise ValueError("a bisection needs at least two pins")
        if not self.open:
            self.open = [(0, len(self.pins) - 1)]

    @property
    def done(self) -> bool:
        return not self.open

    def needed(self) -> set[str]:
        """The pins the next round compares."""
        return {self.pins[i] for span in self.open for i in span}

    def advance(self, differ: Callable[[str, str], bool]) -> None:
        """One round: compare the ends of every open range; split those that differ."""
        following: list[tuple[int, int]] = []
        for low, high in self.open:
            before, after = self.pins[low], self.pins[high]
            self.compared.append((before, after))
            if not differ(before, after):
                continue  # the assumption: equal ends, no change inside
            if high == low + 1:
                self.changes.append((before, after))
                continue
            middle = (low + high) // 2
            following += [(low, middle), (middle, high)]
        self.open = following
        self.changes.sort(key=lambda pair: version_key(pair[0]))


def bisect_all(
    bisections: Mapping[K, Bisection],
    observe: Callable[[dict[str, list[K]]], None],
    differ: Callable[[K, str, str], bool],
) -> None:
    """Run every bisection to the end, round by round: ``observe({pin: [keys]})`` makes the
    observations a round needs (it may find them cached), then each open bisection advances
    with ``differ(key, before, after)``."""
    while True:
        open_keys = [key for key, b in bisections.items() if not b.done]
        if not open_keys:
            return
        wanted: dict[str, list[K]] = {}
        for key in open_keys:
            for pin in sorted(bisections[key].needed(), key=version_key):
                wanted.setdefault(pin, []).append(key)
        observe(dict(sorted(wanted.items(), key=lambda item: version_key(item[0]))))
        for key in open_keys:
            bisections[key].advance(functools.partial(differ, key))
