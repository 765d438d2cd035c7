"""Which upstream files changed between two releases, with added/removed line counts.

Compares the ``vllm`` package folders of two installed pins (``parity.pins``: a pin's own
environment, or the harness's for the default pin) under ``SUBTREES``: the scheduler and KV
cache manager (``v1/core``), the engine core and its client (``v1/engine``) and the API server
(``entrypoints``), where a behaviour change a scenario sees usually lives. Python files only;
identical files are skipped by content before any line diff (``difflib``).
"""

from __future__ import annotations

import difflib
import importlib.util
import json
from dataclasses import asdict, dataclass
from pathlib import Path

SUBTREES = ("v1/core", "v1/engine", "entrypoints")


@dataclass(frozen=True)
class FileChange:
    path: str  # relative to the vllm package, e.g. "v1/core/kv_cache_utils.py"
    added: int
    removed: int
    state: str = "changed"  # changed | added (new in the later release) | removed


def vllm_folder(version: str) -> Path:
    """The ``vllm`` package folder of an installed pin; ``PinError`` when it is not installed."""
    from parity.pins import PinError, env_dir, status

    pin = status(version, sizes=False)
    if pin.where == "main":
        spec = importlib.util.find_spec("vllm")
        if spec is None or spec.origin is None:
            raise PinError(f"pin {version}: the harness's environment has no vllm")
        return Path(spec.origin).parent
    if pin.where == "pins":
        found = sorted(env_dir(version).glob("lib/python*/site-packages/vllm"))
        if found:
            return found[0]
    raise PinError(f"pin {version} is not installed: run parity pins install {version}")


def _files(root: Path, subtrees: tuple[str, ...]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for subtree in subtrees:
        base = root / subtree
        if base.is_dir():
            for path in base.rglob("*.py"):
                found[path.relative_to(root).as_posix()] = path
    return found


def _lines(path: Path | None) -> list[str]:
    if path is None:
        return []
    return path.read_text(encoding="utf-8", errors="replace").splitlines()


def diff_trees(before: Path, after: Path, subtrees: tuple[str, ...] = SUBTREES) -> list[FileChange]:
    """Every Python file under ``subtrees`` that differs between two package folders (added
    and removed files included), with its added and removed line counts; sorted by path."""
    old, new = _files(before, subtrees), _files(after, subtrees)
    changes = []
    for name in sorted(old.keys() | new.keys()):
        a, b = old.get(name), new.get(name)
        if a is not None and b is not None and a.read_bytes() == b.read_bytes():
            continue
        added = removed = 0
        for line in difflib.unified_diff(_lines(a), _lines(b), lineterm="", n=0):
            if line.startswith("+") and not line.startswith("+++"):
                added += 1
            elif line.startswith("-") and not line.startswith("---"):
                removed += 1
        state = "added" if a is None else "removed" if b is None else "changed"
        changes.append(FileChange(name, added, removed, state))
    return changes


def release_diff(before: str, after: str, cache: Path | None = None) -> list[FileChange]:
    """``diff_trees`` of two installed pins, cached as ``cache/files-BEFORE-AFTER.json``."""
    path = cache / f"files-{before}-{after}.json" if cache is not None else None
    if path is not None and path.is_file():
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
            return [FileChange(**row) for row in rows]
        except (OSError, ValueError, KeyError, TypeError):
            pass
    changes = diff_trees(vllm_folder(before), vllm_folder(after))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = [asdict(change) for change in changes]
        path.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return changes
