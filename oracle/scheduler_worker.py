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
from typing import Any

from contract.protocol import Refused, Started, SubmitRequest
from contract.trace import StepTrace
from contract.worker import serve
from oracle.pin import DISTRIBUTION, installed_version


class OracleBackend:
    """``SchedulerTierOracle`` behind the protocol."""

    def __init__(self) -> None:
        from oracle.scheduler_tier import OracleRefusal, SchedulerTierOracle  # imports vllm

        self._refusal = OracleRefusal
        self.oracle = SchedulerTierOracle()

    def start(self, config: dict[str, Any]) -> Started:
        try:
            startup = self.oracle.start(config)
        except self._refusal as exc:
            raise Refused(str(exc)) from None
        return Started(tuple(self.oracle.notes), startup)

    def submit(self, request: SubmitRequest) -> None:
        self.oracle.submit(request, request.output_token_ids)

    def step(self) -> StepTrace:
        return self.oracle.step()

    def close(self) -> None:
        self.oracle.close()


def main() -> int:
    implementation = f"{DISTRIBUTION} {installed_version()} Scheduler (oracle.scheduler_worker)"
    return serve(implementation, OracleBackend)


if __name__ == "__main__":
    sys.exit(main())
