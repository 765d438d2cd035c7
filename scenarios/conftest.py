"""Registers the scenario plugin for ``pytest scenarios/`` unless an entry point already did."""

from __future__ import annotations

import pytest

import parity.pytest_plugin as _plugin


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.is_registered(_plugin):
        config.pluginmanager.register(_plugin, "parity")
