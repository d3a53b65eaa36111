"""A real browser for tests: Debian's ``chromium`` and ``chromium-driver``, driven by selenium.

``ensure_browser()`` installs the two packages with apt when they are missing and we are root
(as ``_slurm.ensure_installed`` does SLURM), and returns the paths of the browser and its
driver; where they cannot be had it raises :class:`BrowserUnavailable` with the reason, which
tests turn into a skip. ``headless_chrome()`` starts a headless browser on them (selenium, a
dev extra, is imported only then).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import Any

PACKAGES = ("chromium", "chromium-driver")
_BINARIES = {"chromium": "/usr/bin/chromium", "chromium-driver": "/usr/bin/chromedriver"}


class BrowserUnavailable(RuntimeError):
    """No browser can run here; the message says why."""


def _found() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for package, path in _BINARIES.items():
        name = os.path.basename(path)
        found[package] = path if os.access(path, os.X_OK) else shutil.which(name)
    return found


def ensure_browser(timeout: float = 900) -> tuple[str, str]:
    """The paths of chromium and chromedriver, installed with apt when missing (root only)."""
    found = _found()
    missing = [package for package, path in found.items() if path is None]
    if missing:
        _install(missing, timeout)
        found = _found()
        still = [package for package, path in found.items() if path is None]
        if still:
            raise BrowserUnavailable(f"apt installed {missing} but {still} are not on the PATH")
    browser, driver = found["chromium"], found["chromium-driver"]
    assert browser is not None and driver is not None
    return browser, driver


def _install(missing: list[str], timeout: float) -> None:
    if os.geteuid() != 0:
        raise BrowserUnavailable(
            f"no browser for the dashboard tests ({', '.join(missing)} missing) and installing "
            f"one needs root: apt install {' '.join(PACKAGES)}"
        )
    if shutil.which("apt-get") is None:
        raise BrowserUnavailable(f"{missing} are missing and there is no apt-get to install them")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    deadline = time.monotonic() + timeout
    for cmd in (
        ["apt-get", "-o", "DPkg::Lock::Timeout=120", "update", "-qq"],
        [
            "apt-get", "-o", "DPkg::Lock::Timeout=120", "install", "-y", "-qq",
            "--no-install-recommends", *PACKAGES,
        ],
    ):
        try:
            done = subprocess.run(
                cmd, env=env, capture_output=True, text=True,
                timeout=max(1.0, deadline - time.monotonic()),
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise BrowserUnavailable(f"{' '.join(cmd)} did not finish within {timeout} s") from None
        if done.returncode != 0:
            raise BrowserUnavailable(
                f"{' '.join(cmd)} failed (exit {done.returncode}): {done.stderr.strip()[-500:]}"
            )


def headless_chrome(width: int = 1400, height: int = 1000) -> Any:
    """A headless chromium under selenium (``driver.quit()`` it). Raises
    :class:`BrowserUnavailable` when selenium, the browser or its driver cannot be had."""
    try:
        from selenium import webdriver
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:
        raise BrowserUnavailable(
            f"selenium is not installed (pip install 'regency[dev]'): {exc}"
        ) from None
    browser, driver = ensure_browser()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in (
        "--headless=new",
        "--no-sandbox",  # as root, in a container
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        f"--window-size={width},{height}",
    ):
        options.add_argument(argument)
    try:
        return webdriver.Chrome(service=Service(executable_path=driver), options=options)
    except WebDriverException as exc:
        raise BrowserUnavailable(f"chromium did not start under chromedriver: {exc.msg}") from None
