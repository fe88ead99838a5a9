"""System programs the tests need (Debian packages installed with apt-get when missing, under a lock shared
by parallel test processes; a missing one that cannot be installed fails the test, never skips it) and the
ports and users to run them with."""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

#: The tests' own folder under the temporary one: the embedded test server's data, the JVMs' archives.
TEST_ROOT = Path(tempfile.gettempdir()) / f"pgstreams-test-{os.getuid()}"


def debian_package(package: str, installed: Path) -> None:
    """Install Debian's ``package`` unless ``installed`` (a file it provides) exists; fail the test when it
    cannot be installed (not root, no apt-get, or apt-get failed)."""
    if installed.exists():
        return
    lock = Path(tempfile.gettempdir()) / "pgstreams-apt.lock"
    with open(lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # one apt-get at a time among the test processes
        if installed.exists():
            return
        if shutil.which("apt-get") is None or os.geteuid() != 0:
            pytest.fail(f"Debian's {package} is missing ({installed}) and cannot be installed here "
                        "(needs apt-get as root)")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", package]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:  # the package lists may be missing or stale
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, text=True, timeout=900)
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0 or not installed.exists():
            pytest.fail(f"apt-get install {package} failed ({done.returncode}):\n{done.stdout[-2000:]}\n"
                        f"{done.stderr[-2000:]}")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def service_user(near: str | None = None) -> str | None:
    """The user to run a server program as: ``None`` (this process's own) unless this process is root, which
    such programs refuse; then the owner of ``near`` (a Unix socket directory the program must reach) when
    that is not root, else ``postgres``."""
    if os.geteuid() != 0:
        return None
    if near and os.path.isdir(near):
        owner = os.stat(near).st_uid
        if owner != 0:
            return pwd.getpwuid(owner).pw_name
    return "postgres"


def as_user(user: str | None) -> list[str]:
    """The command prefix that runs a program as ``user`` (nothing for this process's own user)."""
    return ["runuser", "-u", user, "--"] if user else []
