"""The pinned upstream ``Scheduler`` as a scheduler-tier protocol worker (scheduler-protocol.md).

``python -m oracle.scheduler_worker`` answers the protocol on stdin/stdout
(``contract.worker.serve``) with ``oracle.scheduler_adapter.OracleScheduler``, the same adapter
the in-process target ``oracle`` runs; the fake runner samples each request's
``output_token_ids``. vllm is imported at the first ``start`` (~16 s), so ``hello`` answers at
once. Only ``contract`` and ``vllm`` are imported (never ``engine`` or ``parity``), so it runs
in another upstream release's own environment too: ``PARITY_ORACLE_PIN=V`` with ``PYTHONPATH``
holding just the ``oracle`` and ``contract`` packages (``oracle.pin``; the release-specific
parts of the adapter: ``oracle/releases.py``).
"""

from __future__ import annotations

import sys

from contract.worker import TierBackend, serve
from oracle.pin import DISTRIBUTION, installed_version


def _backend() -> TierBackend:
    """``SchedulerTierOracle`` behind the protocol."""
    from oracle.scheduler_tier import OracleRefusal, SchedulerTierOracle  # imports vllm

    return TierBackend(SchedulerTierOracle(), OracleRefusal)


def main() -> int:
    implementation = f"{DISTRIBUTION} {installed_version()} Scheduler (oracle.scheduler_worker)"
    return serve(implementation, _backend)


if __name__ == "__main__":
    sys.exit(main())
