"""Our engine as a scheduler-tier protocol worker (docs/scheduler-protocol.md).

``python -m engine.core.scheduler_worker [--divergence NAME ...]`` answers the protocol on
stdin/stdout (``contract.worker.serve``) with ``engine.core.scheduler_tier.SchedulerTierEngine``,
the same code the in-process target ``engine`` runs; the fake runner samples each request's
``output_token_ids`` (the harness's copy of the script) instead of the script. The divergence
flags are the scheduler-tier ones of ``engine --divergence NAME``. Upstream: none (the protocol
is the project's; the engine it drives mirrors ``v1/engine/core.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from contract.worker import TierBackend, serve
from engine import divergence
from engine.core.scheduler_tier import EngineRefusal, SchedulerTierEngine

IMPLEMENTATION = "vllm-parity engine (engine.core.scheduler_worker)"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        profiles = divergence.scheduler_tier_profiles(args)
    except ValueError as exc:
        sys.stderr.write(f"engine.core.scheduler_worker: {exc}\n")
        return 2
    name = IMPLEMENTATION + "".join(f" --divergence {p}" for p in profiles)
    return serve(name, lambda: TierBackend(SchedulerTierEngine(profiles), EngineRefusal))


if __name__ == "__main__":
    sys.exit(main())
