"""``parity bisect`` on real pins: the release whose startup check reserves the null block.

At the scheduler tier (protocol workers, no server) over 0.28.0..0.29.0, the boundary config of
``scenarios/bisect/null-block-boundary-n3-m96.yaml`` (3 blocks of 32 for max_model_len 96)
starts on 0.28.0 and is refused by 0.29.0's startup check. The pins are installed when missing
(bounded, as ``parity pins install`` does), into the project's pins folder, and kept.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from parity import pins, pins_install
from parity.cli import main

pytestmark = [pytest.mark.oracle, pytest.mark.timeout(2400)]

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scenarios" / "bisect" / "null-block-boundary-n3-m96.yaml"
BEFORE, AFTER = "0.28.0", "0.29.0"


@pytest.fixture(scope="module")
def pins_root() -> Path:
    root = pins.pins_root()
    for version in (BEFORE, AFTER):
        if not pins.status(version, sizes=False).installed:
            result = pins_install.install(version, timeout_s=900)
            assert result.skipped is None or pins.status(version).installed, result
    return root


def test_bisect_names_the_first_release_that_refuses_the_boundary_config(
    pins_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "parity.toml"
    config.write_text(
        "[parity]\n"
        f'models = "{ROOT / ".cache" / "models"}"\n'
        f'pins = "{pins_root}"\n'
        'reports = "reports"\n',
        encoding="utf-8",
    )
    argv = ["--config", str(config), "bisect", str(SCENARIO), "--pins", f"{BEFORE}..{AFTER}"]
    assert main([*argv, "--tier", "scheduler"]) == 0
    out = capsys.readouterr().out
    assert f"{AFTER} is the first release with the new behaviour ({BEFORE} -> {AFTER})" in out
    assert "capacity_overhang" in out and "startup" in out
    assert "2 observations made" in out
    report = (tmp_path / "reports" / "bisect" / "null-block-boundary-n3-m96.md").read_text()
    assert f"### {AFTER}: first release with the new behaviour" in report
    assert "`v1/core/kv_cache_utils.py`" in report  # where the startup check lives
    assert main([*argv, "--tier", "scheduler"]) == 0  # again: from the cache
    assert "0 observations made" in capsys.readouterr().out
