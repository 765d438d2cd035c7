"""The llama-cpp example (ports/llama-cpp/) runs the default suite clean.

llama.cpp's server runs from the port env ``.cache/ports/llama-cpp`` (``make port-llama-cpp``);
without it this test fails saying so. Its ledger decides every finding, so the README's command
exits 0 with nothing NEW or STALE; the scheduler tier is UNSUPPORTED (a server only), and so is
every scenario that needs what llama.cpp lacks (token ids in replies, /metrics).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from port_suite import ROOT, check, run_port

pytestmark = [pytest.mark.server, pytest.mark.oracle, pytest.mark.long, pytest.mark.timeout(3300)]

PORT_PYTHON = ROOT / ".cache" / "ports" / "llama-cpp" / "bin" / "python"
EXPECTED_UNSUPPORTED = [
    "target 'llama-cpp' has no scheduler tier (a server only)",
    "model random: llama-cpp takes a GGUF file, and it has none",
    "expect.output_token_ids needs the generated ids, a vLLM extension the target does not",
]


def test_the_default_suite_runs_clean_against_the_oracle(tmp_path: Path) -> None:
    if not PORT_PYTHON.exists():
        pytest.fail(
            f"{PORT_PYTHON.relative_to(ROOT)} is missing: run `make port-llama-cpp` to build "
            "llama-cpp-python into the port env (the llama-cpp example needs it)"
        )
    check(run_port("llama-cpp", tmp_path), EXPECTED_UNSUPPORTED)
