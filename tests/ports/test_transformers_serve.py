"""The transformers-serve example (ports/transformers-serve/) runs the default suite clean.

Its ledger decides every finding, so the README's command exits 0 with nothing NEW or STALE;
the scheduler tier is UNSUPPORTED (a server only), and so is every scenario that needs a vLLM
request extension the server refuses (it answers 422 to unknown fields).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from port_suite import check, run_port

pytestmark = [pytest.mark.server, pytest.mark.oracle, pytest.mark.long, pytest.mark.timeout(3300)]

EXTENSIONS = (
    *("ignore_eos", "min_tokens", "stop_token_ids", "include_stop_str_in_output"),
    *("bad_words", "truncate_prompt_tokens", "repetition_detection", "thinking_token_budget"),
)
EXPECTED_UNSUPPORTED = [
    "target 'transformers-serve' has no scheduler tier (a server only)",
    "expect.min_preemptions reads vllm:num_preemptions, a vLLM extension the target does not",
    *(f"sets {field}, a vLLM extension the target does not accept" for field in EXTENSIONS),
]


def test_the_default_suite_runs_clean_against_the_oracle(tmp_path: Path) -> None:
    check(run_port("transformers-serve", tmp_path), EXPECTED_UNSUPPORTED)
