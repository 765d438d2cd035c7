"""Constants and helpers shared by the serve-tier tests (importable; conftest.py is not)."""

from __future__ import annotations

import sys
from pathlib import Path

from contract.scripted import vocab

HERE = Path(__file__).resolve().parent
FAKE_SERVER = HERE / "fake_server.py"
# The flags of the scripted-model servers (block size 32: CPU attention needs a multiple of 32).
SCRIPTED_ARGS = {"block_size": 32, "max_model_len": 512, "reasoning_parser": "deepseek_r1"}
# The port's wedge at block size 32 (docs/oracle-on-cpu.md): 2 blocks (1 usable), M=2048.
WEDGE_ARGS = {"block_size": 32, "num_gpu_blocks_override": 2, "max_model_len": 2048}
WEDGE_PROMPT = (vocab.BOS, vocab.answer_selector(20), vocab.think_selector(3))
REASONING_MESSAGES = ({"role": "user", "content": "<|think:3|><|answer:2|>"},)


def fake_target(*extra: str) -> str:
    """``external:`` spec of the fake server (the pool appends the server flags)."""
    words = [sys.executable, str(FAKE_SERVER), "--port", "{port}", *extra]
    return "external:" + " ".join(words)
