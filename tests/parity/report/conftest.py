"""Fixtures for the report tests: a synthetic run of both tiers (``report_support``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from report_support import VERSIONS, SyntheticRun, make_synthetic_run


def pytest_configure(config: pytest.Config) -> None:
    # also registered in pyproject.toml; kept here so this folder runs warning-free on its own
    config.addinivalue_line(
        "markers", "browser: loads the HTML report in Debian's headless chromium (make chromium)"
    )


@pytest.fixture
def synthetic_run() -> SyntheticRun:
    return make_synthetic_run()


@pytest.fixture
def versions() -> dict[str, str]:
    return dict(VERSIONS)


@pytest.fixture
def make_run() -> Callable[[], SyntheticRun]:
    return make_synthetic_run
