"""In-place YAML edits: ruamel.yaml's round-trip mode and an atomic write.

Round-trip mode keeps comments, key order and quoting of what it does not touch (used by
``parity decide`` on the ledger and ``parity run --record`` on scenario files). The layout is
the repository's: 2-space mappings, list items indented by 2 (``  - id: r1``), 100 columns.
"""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Any


def round_trip() -> Any:
    """A ruamel ``YAML`` in round-trip mode with the repository's layout."""
    from ruamel.yaml import YAML

    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 100
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.Representer = _representer()
    return yaml


def _representer() -> Any:
    """ruamel's round-trip representer with ``null`` spelled out (it writes ``key:``)."""
    from ruamel.yaml.representer import RoundTripRepresenter

    class Representer(RoundTripRepresenter):  # type: ignore[misc]
        pass

    def null(representer: Any, _: None) -> Any:
        return representer.represent_scalar("tag:yaml.org,2002:null", "null")

    Representer.add_representer(type(None), null)
    return Representer


def dump(yaml: Any, doc: Any) -> str:
    """``doc`` as text."""
    buffer = io.StringIO()
    yaml.dump(doc, buffer)
    return buffer.getvalue()


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one rename; an existing file keeps its mode, a new one
    is 0644 (``mkstemp`` would leave 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o7777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
