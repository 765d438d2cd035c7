"""``parity init [DIR]``: a starter project for a port's own repository.

Writes, without touching files that exist (unless ``force``): ``parity.toml`` (commented, with
one example port target), an empty ``ledger.yaml``, ``scenarios/example.yaml`` with the scenario
JSON Schema beside it (``scenarios/schema.json``, so editors complete and check scenario files),
and ``parity-ci.yml``, an example CI job that runs the suite and keeps the report as an
artifact. The templates live in ``parity/templates/``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

TEMPLATES = Path(__file__).with_name("templates")
FILES = (
    ("parity.toml", "parity.toml"),
    ("ledger.yaml", "ledger.yaml"),
    ("example.yaml", "scenarios/example.yaml"),
    ("parity-ci.yml", "parity-ci.yml"),
)


def write_starter(folder: Path, *, force: bool = False) -> Iterator[tuple[Path, bool]]:
    """Write the starter files into ``folder``; yields (path, written) per file."""
    from parity.scenario import json_schema

    folder.mkdir(parents=True, exist_ok=True)
    contents = [(dest, (TEMPLATES / name).read_text(encoding="utf-8")) for name, dest in FILES]
    contents.append(("scenarios/schema.json", json.dumps(json_schema(), indent=2) + "\n"))
    for dest, text in contents:
        path = folder / dest
        if path.exists() and not force:
            yield path, False
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        yield path, True
