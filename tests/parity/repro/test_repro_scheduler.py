"""``port-wedge-scheduler``: the port's record with its own numbers (block size 16) at the
scheduler tier, on our engine and upstream's scheduler in process: the control finishes with
16 tokens; the wedge leg wedges identically on both (46 tokens, then nothing runs)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from repro_support import HANGS

pytestmark = [pytest.mark.oracle, pytest.mark.timeout(300)]


def test_port_wedge_at_the_scheduler_tier(
    run_cli: Callable[..., tuple[int, str, str]], tmp_path: Path
) -> None:
    file = str(HANGS / "port-wedge-scheduler.repro.yaml")
    code, out, err = run_cli(file, "--out", str(tmp_path))
    assert code == 0, out + err
    for target in ("engine", "oracle"):
        assert f"[control] {target}: finished: r1 16 tokens" in out
        assert (
            f"[wedge] {target}: wedged: r1 46 tokens; wedged at step 47: no progress for 50 "
            "steps (stuck: r1; running: 0, waiting: 1; free blocks: 3)"
        ) in out
    record = (tmp_path / "port-wedge-scheduler.md").read_text()
    assert "| wedge | `oracle` | `--block-size 16 --num-gpu-blocks-override 4" in record
