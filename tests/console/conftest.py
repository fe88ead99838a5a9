"""Fixtures of the console tests: Debian's headless Chromium (installed with apt-get when missing, under
a lock shared by parallel test processes; failing loudly when it cannot be) driven by Playwright."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _system import debian_package

#: Screenshots of every page the browser tests visit.
SCREENSHOTS = Path(os.environ.get("PGSTREAMS_SCREENSHOTS", Path(tempfile.gettempdir()) / "pgstreams-console"))


@pytest.fixture(scope="session")
def chromium_path() -> str:
    """The system Chromium, installed from Debian's ``chromium`` package when missing."""
    debian_package("chromium", Path("/usr/bin/chromium"))
    path = shutil.which("chromium")
    if not path:
        raise RuntimeError("Debian's chromium package is installed but no chromium command is on the PATH")
    return path


@pytest.fixture(scope="session")
def browser(chromium_path: str) -> Iterator[Any]:
    """A headless Chromium driven by Playwright."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium_path, headless=True,
                               args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def screenshots() -> Path:
    """Where the test run saves its screenshots."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS
