"""A port maintainer's first run, exactly as they would do it: the harness built as a wheel and
installed (not editable) into a fresh environment, then, from a folder outside this checkout,
``parity init``, a target added to ``parity.toml``, ``parity model build`` and
``parity run @default --target oracle --target <it>``.

The added target is our engine declared as a port would declare its own (a server command line
with vLLM's flag spellings, and a scheduler worker speaking the harness's protocol), so the run compares two real servers and must reach a verdict: every
scenario of the default suite reported, the port's name as its label, no startup failure.
Nothing here reads the checkout at run time: the wheel must carry the suites, the defaults, the
templates and the oracle's site folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from parity.bench.suite import timed_command
from parity.serve.lease import ENV

ROOT = Path(__file__).resolve().parents[1]
UV = Path(sys.executable).parent / "uv"
CUDA_SIDE_PACKAGES = ("torchvision", "torchaudio", "torchcodec", "triton")

pytestmark = [pytest.mark.long, pytest.mark.timeout(1500)]

PORT_TARGET = """

# Added by the test: our engine, declared the way a port declares its own server and its own
# scheduler worker (the JSON-lines protocol of docs/scheduler-protocol.md).
[targets.myengine]
vllm_flags = true

[targets.myengine.serve]
command = ["{python}", "-m", "engine", "serve", "{model}", "--host", "{host}", "--port", "{port}"]
health = "/health"
startup_timeout_s = 300
# the KV cache size the built-in targets use too (else the CPU backend sizes it from free memory)
env = { VLLM_CPU_KVCACHE_SPACE = "1" }

[targets.myengine.scheduler]
command = ["{python}", "-m", "engine.core.scheduler_worker"]
"""


@dataclass(frozen=True)
class Ran:
    """A finished command: its exit code and its output (stdout and stderr, interleaved)."""

    returncode: int | None
    output: str


def _run(argv: list[str], *, cwd: Path, timeout: float, env: dict[str, str] | None = None
         ) -> Ran:  # fmt: skip
    """``argv`` in its own process group (``timed_command``): bounded, and on a timeout the
    whole group (the harness and every server it started) is stopped, not the child alone."""
    with tempfile.NamedTemporaryFile(prefix="wheel-install-", suffix=".log", delete=False) as f:
        log = Path(f.name)
    try:
        done = timed_command(argv, cwd=cwd, log=log, timeout_s=timeout, env=env)
        output = log.read_text(encoding="utf-8", errors="replace")
    finally:
        log.unlink(missing_ok=True)
    if "not finished" in done.get("error", ""):
        pytest.fail(f"{' '.join(argv[:4])} ran over {timeout:.0f} s:\n{output[-3000:]}")
    return Ran(done["returncode"], output)


def _find_links() -> list[str]:
    links = os.environ.get("PIP_FIND_LINKS", "").split()
    if not links:
        system = shutil.which("python3.11") or shutil.which("python3") or "python3"
        done = _run([system, "-m", "pip", "config", "get", "global.find-links"],
                    cwd=ROOT, timeout=60)  # fmt: skip
        links = done.output.split() if done.returncode == 0 else []
    return [arg for link in links for arg in ("--find-links", link)]


@pytest.fixture(scope="module")
def fresh_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment with the harness wheel and the locked dependencies."""
    base = tmp_path_factory.mktemp("wheel")
    dist = base / "dist"
    built = _run([str(UV), "build", "--wheel", "--no-build-isolation", "--quiet", "--python",
                  sys.executable, "--out-dir", str(dist), str(ROOT)], cwd=base, timeout=300)  # fmt: skip
    assert built.returncode == 0, built.output[-3000:]
    (wheel,) = dist.glob("vllm_parity-*.whl")
    env = base / "env"
    made = _run([str(UV), "venv", "--quiet", "--python", sys.executable, str(env)], cwd=base,
                timeout=120)  # fmt: skip
    assert made.returncode == 0, made.output
    python = env / "bin" / "python"
    installed = _run([str(UV), "pip", "install", "--quiet", "--compile-bytecode", "--python",
                      str(python), "--index-strategy", "unsafe-best-match", *_find_links(),
                      "-c", str(ROOT / "constraints.txt"), str(wheel)],
                     cwd=base, timeout=900)  # fmt: skip
    assert installed.returncode == 0, installed.output[-3000:]
    _run([str(UV), "pip", "uninstall", "--quiet", "--python", str(python), *CUDA_SIDE_PACKAGES],
         cwd=base, timeout=120)  # fmt: skip
    return env


@pytest.fixture
def own_temp() -> Iterator[Path]:
    """A temp folder for the run, removed after it: the new environment's oracle compiles its
    logprobs kernel, and torch keeps the 154 MB precompiled header for that environment's path
    in ``<temp>/torchinductor_<user>`` (docs/oracle-on-cpu.md). Short, like ``/tmp`` itself,
    so that the servers' socket paths under it stay within the 107-byte limit."""
    with tempfile.TemporaryDirectory(prefix="wheel-run-", ignore_cleanup_errors=True) as folder:
        yield Path(folder)


def test_a_port_runs_the_default_suite_from_its_own_folder(
    fresh_env: Path, tmp_path: Path, own_temp: Path
) -> None:
    parity = str(fresh_env / "bin" / "parity")
    # a fresh machine: not this checkout's packages, not the test session's server broker
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", ENV)}
    env["PATH"] = f"{fresh_env / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["TMPDIR"] = str(own_temp)
    project = tmp_path / "my-port"
    shown = _run([parity, "--help"], cwd=tmp_path, timeout=60, env=env)
    assert shown.returncode == 0, shown.output
    where = _run([str(fresh_env / "bin" / "python"), "-c", "import parity; print(parity.__file__)"],
                 cwd=tmp_path, timeout=60, env=env)  # fmt: skip
    assert str(fresh_env) in where.output and str(ROOT) not in where.output  # not the checkout

    started = _run([parity, "init", str(project)], cwd=tmp_path, timeout=60, env=env)
    assert started.returncode == 0, started.output
    config = project / "parity.toml"
    config.write_text(config.read_text() + PORT_TARGET)
    built = _run([parity, "model", "build"], cwd=project, timeout=300, env=env)
    assert built.returncode == 0, built.output
    assert (project / ".cache" / "models" / "scripted" / "model.safetensors").is_file()

    ran = _run([parity, "run", "@default", "--target", "oracle", "--target", "myengine"],
               cwd=project, timeout=1200, env=env)  # fmt: skip
    # A fresh project's ledger is empty: known engine divergences are NEW there (exit 1).
    assert ran.returncode in (0, 1), ran.output[-6000:]
    last = json.loads((project / "reports" / "last-run.json").read_text())
    assert last["targets"] == ["oracle", "myengine"]
    assert len(last["results"]) >= 40  # every scenario of the default suite, both tiers
    statuses = {r["status"] for r in last["results"]}
    assert statuses <= {"pass", "divergence", "unsupported"}, statuses
    assert "pass" in statuses
    # the port's name is its label: in the summary line, whatever diverged or did not
    assert re.search(r"scenarios: .* in [\d.]+ s \(oracle vs myengine\)\n", ran.output), ran.output[
        -3000:
    ]
    paths = {d["path"] for r in last["results"] for d in r.get("divergences", [])}
    assert not any(p.startswith("startup") for p in paths), sorted(paths)[:20]
    shutil.rmtree(project / ".cache", ignore_errors=True)
