"""Harness tier of the benchmark: how fast the harness turns a wedge into a verdict (the suite's
wall time and the fresh-clone time are measured in ``parity.bench.suite``).

Wedge verdict latency: a server where one streaming request (the prompt ``[BOS, <|answer:20|>,
<|think:3|>]``, ignore_eos) outgrows a KV pool its startup check should have refused, is
preempted by itself and never resumes. Upstream refuses such configs at startup
(``vllm/v1/core/kv_cache_utils.py`` capacity check), so the first case that starts and wedges
is used (``WEDGE_CASES``): our engine with ``--divergence legacy-capacity`` (block size 32, 3
blocks, M 96: the port's null-block miscount), else ``oracle[unchecked]`` (the pin with the
check disabled, test-only; block size 32, 2 blocks, M 2048: 30 tokens, then nothing). The
request goes through ``parity.serve`` with its default stall bound; the latency is from the
last progress (last byte, or last change of the server's token counter) to the verdict (the
observation returned, evidence sampled). Each sample is one request on the same server.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.scripted import vocab
from parity.bench.stats import median, rounded
from parity.serve import ServeLimits, ServerConfig, ServeRequestSpec, ServerPool, run_serve
from parity.serve.observe import STALL_OUTCOMES
from parity.serve.spec import DEFAULT_STALL_S

WEDGE_PROMPT = (vocab.BOS, vocab.answer_selector(20), vocab.think_selector(3))


@dataclass(frozen=True, slots=True)
class WedgeCase:
    """A target and the smallest config on which one request wedges it."""

    target: str
    engine_args: dict[str, Any]
    max_tokens: int


WEDGE_CASES = (
    # Legacy capacity plans against all 3 blocks (96 tokens = M): 2 are usable, so the request
    # preempts itself at token 64 and waits forever.
    WedgeCase(
        "engine --divergence legacy-capacity",
        {"block_size": 32, "num_gpu_blocks_override": 3, "max_model_len": 96},
        96 - len(WEDGE_PROMPT),
    ),
    # Upstream with the check disabled: 1 usable block, 30 tokens, then nothing
    # (docs/oracle-on-cpu.md).
    WedgeCase(
        "oracle[unchecked]",
        {"block_size": 32, "num_gpu_blocks_override": 2, "max_model_len": 2048},
        56,
    ),
)
WEDGE_LIMITS = ServeLimits(startup_timeout_s=300.0, request_timeout_s=60.0, stall_s=DEFAULT_STALL_S)

Notify = Callable[[str], None]


def wedge_request(case: WedgeCase) -> ServeRequestSpec:
    return ServeRequestSpec(
        id="wedge",
        prompt_token_ids=WEDGE_PROMPT,
        max_tokens=case.max_tokens,
        stream=True,
        body={"ignore_eos": True, "temperature": 0.0, "return_token_ids": True},
    )


def wedge_config(model: str | Path, case: WedgeCase) -> ServerConfig:
    return ServerConfig(model=str(model), engine_args={**case.engine_args, "dtype": "float32"})


def _sample(run: Any) -> dict[str, Any]:
    obs = run.observations[0]
    sample: dict[str, Any] = {
        "outcome": obs.outcome,
        "detail": obs.detail,
        "tokens": obs.num_tokens,
    }
    if obs.outcome in STALL_OUTCOMES and obs.stall is not None:
        last = obs.t_last_progress_ms or obs.stall.t_last_progress_ms
        sample["verdict_latency_s"] = rounded(((obs.t_end_ms or 0.0) - last) / 1000, 3)
        sample["detect_latency_s"] = rounded(
            (obs.stall.t_verdict_ms - obs.stall.t_last_progress_ms) / 1000, 3
        )
        health = obs.stall.health
        sample["health_during_stall"] = health.status if health is not None else None
    return sample


def wedge_latency(
    model: str | Path,
    log_dir: Path,
    *,
    samples: int,
    notify: Notify,
    cases: tuple[WedgeCase, ...] = WEDGE_CASES,
) -> dict[str, Any]:
    """Start the first case's target that wedges and time ``samples`` verdicts on it."""
    tried: list[dict[str, Any]] = []
    with ServerPool(log_dir / "wedge") as pool:
        for case in cases:
            target = case.target
            notify(f"wedge: starting {target}")
            config = wedge_config(model, case)
            handle = pool.get(target, config, startup_timeout_s=WEDGE_LIMITS.startup_timeout_s)
            if not handle.startup.started:
                tried.append({"target": target, "outcome": handle.startup.outcome,
                              "error": handle.startup.error})  # fmt: skip
                continue
            results: list[dict[str, Any]] = []
            for index in range(samples):
                notify(f"wedge: {target}, request {index + 1}/{samples}")
                results.append(_sample(run_serve(handle, [wedge_request(case)], WEDGE_LIMITS)))
                if "verdict_latency_s" not in results[-1]:
                    break  # this target does not wedge: no verdict to time
            latencies = [r["verdict_latency_s"] for r in results if "verdict_latency_s" in r]
            if not latencies:
                tried.append({"target": target, "outcome": "no wedge",
                              "error": results[-1]["detail"] if results else None})  # fmt: skip
                pool.stop(handle)
                continue
            return {
                "target": handle.label,
                "startup_s": handle.startup.startup_s,
                "config": case.engine_args,
                "max_tokens": case.max_tokens,
                "stall_s": WEDGE_LIMITS.stall_s,
                "samples": results,
                "verdict_latency_s": rounded(median(latencies), 3),
                "detect_latency_s": rounded(median(r["detect_latency_s"] for r in results), 3),
                "tried": tried,
            }
    return {"error": "no candidate target wedged", "tried": tried}
