"""The core imports none of the optional parts (metrics, console, the Kafka gateway, their libraries), and the
console's pure helpers: credentials, the loopback rule, value rendering."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pgstreams.console import Credentials, check_binding, is_loopback
from pgstreams.console.render import duration, size, sparkline, value_text
from pgstreams.errors import ConfigurationError


def test_the_core_imports_no_optional_part() -> None:
    code = ("import sys, pgstreams, pgstreams.client, pgstreams.consumer, pgstreams.groups, "
            "pgstreams.storage, pgstreams.worker, pgstreams.aio, pgstreams.maintenance, pgstreams.admin\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('prometheus_client', 'starlette', "
            "'jinja2', 'uvicorn', 'kio') or m.split('.')[:2] in (['pgstreams', 'console'], "
            "['pgstreams', 'metrics'], ['pgstreams', 'cli'], ['pgstreams', 'kafka'])]\n"
            "assert not bad, bad")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_credentials_and_the_loopback_rule() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("example.org")
    check_binding("127.0.0.1", Credentials())
    with pytest.raises(ConfigurationError, match="PGSTREAMS_CONSOLE_TOKEN"):
        check_binding("0.0.0.0", Credentials())
    check_binding("0.0.0.0", Credentials(token="t"))
    with pytest.raises(ConfigurationError, match="both"):
        Credentials.from_env({"PGSTREAMS_CONSOLE_USER": "admin"})
    creds = Credentials.from_env({"PGSTREAMS_CONSOLE_USER": "admin", "PGSTREAMS_CONSOLE_PASSWORD": "pw"})
    assert creds.accepts("Basic YWRtaW46cHc=", None)  # admin:pw
    assert not creds.accepts("Basic YWRtaW46eHg=", None) and not creds.accepts(None, None)
    assert not creds.accepts("Basic !!!", None)
    token = Credentials(token="abc")
    assert token.accepts("Bearer abc", None) and token.accepts(None, "abc")
    assert not token.accepts("Bearer abd", None) and not token.accepts(None, None)
    assert Credentials().accepts(None, None)


def test_values_render_as_pretty_json_text_or_hex() -> None:
    assert value_text({"b": [1, 2], "a": "é"}) == ('{\n  "a": "é",\n  "b": [\n    1,\n    2\n  ]\n}', "json")
    assert value_text("plain") == ("plain", "text")
    assert value_text(b"\x00\xff" * 9) == ("00 ff " * 7 + "00 ff 00 ff", "bytes")  # 16 bytes a group
    assert size(512) == "512 B" and size(1536) == "1.5 KiB" and duration(86_400_000) == "1d"
    assert duration(1500) == "1.5s"
    assert "polyline" in sparkline([1.0, 2.0, 3.0], "x") and "polyline" not in sparkline([1.0], "x")
