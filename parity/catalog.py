"""The scenario suites that travel with the package: ``parity run @default`` from any folder.

The repository's ``scenarios/`` folder ships inside the wheel as the data package
``parity.suites``; in a checkout it is read in place. Suites (``parity suites`` lists them):

- ``@scheduler``: scheduler-tier scenarios (upstream's Scheduler vs a port's, step by step);
- ``@serve``: serve-tier scenarios (real servers over HTTP);
- ``@hangs``: hang reproductions for ``parity repro`` (``*.repro.yaml``);
- ``@default``: ``@scheduler`` and ``@serve``, what ``make parity`` runs.

``expand_paths`` turns ``@name`` arguments into folders; anything else is a path as given.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from parity.errors import ScenarioError

SUITES: dict[str, tuple[str, ...]] = {
    "default": ("scheduler", "serve"),
    "scheduler": ("scheduler",),
    "serve": ("serve",),
    "hangs": ("hangs",),
}
DESCRIPTIONS = {
    "default": "the default suite: scheduler and serve",
    "scheduler": "scheduler-tier scenarios (step traces)",
    "serve": "serve-tier scenarios (real servers over HTTP)",
    "hangs": "hang reproductions for parity repro",
}


def suites_root() -> Path:
    """Where the bundled suites are: the installed data package, else the checkout's folder."""
    here = Path(__file__).resolve().parent
    installed = here / "suites"
    if installed.is_dir():
        return installed
    return here.parent / "scenarios"


def suite_folders(name: str) -> list[Path]:
    """The folders of suite ``name`` (without the ``@``); ``ScenarioError`` for an unknown one."""
    if name not in SUITES:
        known = ", ".join("@" + n for n in SUITES)
        raise ScenarioError.at(f"@{name}", None, f"unknown suite (known: {known})")
    return [suites_root() / part for part in SUITES[name]]


def expand_paths(paths: Iterable[str | Path]) -> list[Path]:
    """``@suite`` names become their folders; other paths stay as given."""
    found: list[Path] = []
    for raw in paths:
        text = str(raw)
        if text.startswith("@"):
            found.extend(suite_folders(text[1:]))
        else:
            found.append(Path(text))
    return found


def bundled_ledger() -> Path:
    """The ledger of the bundled suites (the harness's own decisions about its engine)."""
    return suites_root() / "ledger.yaml"


def format_suites() -> str:
    """One line per suite: name, scenario count, what it is, where it lives."""
    lines = []
    for name, parts in SUITES.items():
        count = 0
        for part in parts:
            folder = suites_root() / part
            if folder.is_dir():
                count += sum(1 for p in folder.rglob("*.yaml") if p.is_file())
        where = ", ".join(str(suites_root() / p) for p in parts)
        lines.append(f"@{name:<10} {count:>3} files  {DESCRIPTIONS[name]}  ({where})")
    return "\n".join(lines) + "\n"
