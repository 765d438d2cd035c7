"""``output_token_ids`` (what the harness sends a worker) is exactly what the in-process fake
runners sample: for every scheduler-tier scenario, each request's k-th sampled token, through
chunked prefills, preemption and recompute, is ``output_token_ids[k]``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from parity_helpers import ROOT

from parity.loader import load_scenarios
from parity.runner import run_target
from parity.targets import make_target
from parity.targets._script import model_eos_ids, output_token_ids

pytestmark = pytest.mark.timeout(600)


def check_outputs(target: Any, model_dir: Path) -> dict[str, int]:
    """Every scenario's sampled tokens against the harness's lists; counts of what was covered."""
    covered = {"requests": 0, "tokens": 0, "recomputed": 0, "min_tokens": 0}
    eos = model_eos_ids(str(model_dir))
    for scenario in load_scenarios([ROOT / "scenarios"]):
        if not scenario.runs_at_scheduler_tier:
            continue
        run = run_target(scenario, target)
        for request in scenario.requests:
            assert request.prompt_token_ids is not None and request.max_tokens is not None
            expected = output_token_ids(
                request.prompt_token_ids,
                request.max_tokens,
                request.min_tokens,
                request.stop_token_ids,
                eos,
            )
            outcome = run.summary.outcomes[request.id]
            sampled = list(outcome.output_token_ids)
            assert sampled == expected[: len(sampled)], f"{scenario.id}: {request.id}"
            covered["requests"] += 1
            covered["tokens"] += len(sampled)
            covered["recomputed"] += bool(outcome.num_preemptions and sampled)
            covered["min_tokens"] += bool(request.min_tokens)
    return covered


def test_the_engine_runner_samples_output_token_ids(scripted_model_dir: Path) -> None:
    covered = check_outputs(make_target(f"engine:{scripted_model_dir}"), scripted_model_dir)
    assert covered["recomputed"] >= 3 and covered["min_tokens"] >= 1 and covered["tokens"] > 500


@pytest.mark.oracle
def test_the_oracle_runner_samples_output_token_ids(
    oracle_target: Any, scripted_model_dir: Path
) -> None:
    covered = check_outputs(oracle_target, scripted_model_dir)
    assert covered["recomputed"] >= 3 and covered["min_tokens"] >= 1 and covered["tokens"] > 500
