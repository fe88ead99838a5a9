"""Fixtures of the console tests: Debian's headless Chromium (installed with apt-get when missing, under
a lock shared by parallel test processes; failing loudly when it cannot be) driven by Playwright."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

#: Screenshots of every page the browser tests visit.
SCREENSHOTS = Path(os.environ.get("PGSTREAMS_SCREENSHOTS", Path(tempfile.gettempdir()) / "pgstreams-console"))


def _apt_install(package: str) -> None:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", package]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:  # the package lists may be missing or stale
        subprocess.run(["apt-get", "update"], capture_output=True, text=True, env=env)
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"installing Debian's {package} failed ({done.returncode}):\n{done.stdout[-2000:]}"
                           f"\n{done.stderr[-2000:]}")


@pytest.fixture(scope="session")
def chromium_path() -> str:
    """The system Chromium, installed from Debian's ``chromium`` package when missing."""
    path = shutil.which("chromium")
    if path:
        return path
    lock = Path(tempfile.gettempdir()) / "pgstreams-chromium-install.lock"
    with open(lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            if not shutil.which("chromium"):
                _apt_install("chromium")
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
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
