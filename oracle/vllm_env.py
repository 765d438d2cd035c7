"""What a module does before its first ``import vllm``. Upstream: none.

``prepare_vllm_import()`` checks that the installed vllm is the expected pin
(``oracle.pin.check_installed``), then sets the offline environment the launcher also gives the
server (``oracle.launcher.OFFLINE_ENV``; variables already set are kept).
"""

from __future__ import annotations

import os

from oracle.launcher import OFFLINE_ENV
from oracle.pin import check_installed


def prepare_vllm_import() -> None:
    """Check the pin, then set the offline environment (see the module docstring)."""
    check_installed()
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
