"""The dashboard's tests: one dashboard per test session (it serves the session's controller),
a headless chromium (installed with apt when missing and root: regency/testing/_browser.py;
otherwise the browser tests skip and say why), and where the screenshots go."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import regency
from regency import _dashboard
from regency.testing._browser import BrowserUnavailable, headless_chrome


@pytest.fixture
def dashboard_url() -> Iterator[str]:
    """The URL (with its token) of the controller's dashboard, stopped after the test (with
    the trace rings it kept on: later tests' ``regency.trace()`` find none)."""
    url: str = regency.serve_dashboard()
    try:
        yield url
    finally:
        _dashboard.stop()


@pytest.fixture(scope="session")
def _chrome() -> Iterator[Any]:
    try:
        driver = headless_chrome()
    except BrowserUnavailable as exc:
        pytest.skip(f"no browser for the dashboard tests: {exc}")
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser(_chrome: Any) -> Iterator[Any]:
    """A headless chromium (shared by the session's tests: its cookies are cleared first)."""
    _chrome.delete_all_cookies()
    try:
        yield _chrome
    finally:
        _chrome.get("about:blank")  # the page stops polling


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    """Where a test saves its screenshots: $REGENCY_DASHBOARD_SCREENSHOTS (docs/images, when
    the docs' pictures are made), else the test's temporary directory."""
    chosen = os.environ.get("REGENCY_DASHBOARD_SCREENSHOTS")
    path = Path(chosen) if chosen else tmp_path
    path.mkdir(parents=True, exist_ok=True)
    return path
