"""Property-based tests of input: arbitrary names, keys, headers, values, options and CLI arguments are
either refused with a clear error naming the problem (and nothing changed), or stored and read back byte
for byte. No SQL error text reaches the user. Bounded (few examples) to keep the suite fast."""

from __future__ import annotations

import itertools
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pgstreams
from _core_helpers import db_state

_SETTINGS = settings(max_examples=15, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])
_counter = itertools.count()

# Text that PostgreSQL cannot hold (NUL, lone surrogates) must be refused, everything else stored.
_text = st.text(st.characters(), max_size=40)
_sql_words = ("syntax error", "SQLSTATE", "psycopg", "LINE 1", "CONTEXT:")


def _clean(message: str) -> None:
    assert message and not any(w in message for w in _sql_words), message


@_SETTINGS
@given(name=st.one_of(_text, st.from_regex(r"[A-Za-z0-9._-]{1,12}", fullmatch=True)),
       partitions=st.one_of(st.integers(-3, 1100), st.none(), st.text(max_size=3), st.floats()))
def test_topic_names_and_partitions(client: pgstreams.Client, name: str, partitions: Any) -> None:
    before = {t.name for t in client.list_topics()}
    try:
        info = client.create_topic(name, partitions)
    except (pgstreams.InvalidName, pgstreams.InvalidArgument) as exc:
        _clean(str(exc))
        assert {t.name for t in client.list_topics()} == before
        return
    assert info.name == name and info.partitions == partitions
    assert name in {t.name for t in client.list_topics()}
    client.delete_topic(name)


@_SETTINGS
@given(key=st.one_of(st.none(), _text, st.integers()),
       headers=st.one_of(st.none(), st.dictionaries(_text, st.one_of(_text, st.integers()), max_size=3)),
       value=st.one_of(st.binary(max_size=64), _text, st.integers(), st.floats(allow_nan=False),
                       st.lists(st.integers(), max_size=3), st.dictionaries(_text, st.integers(), max_size=3),
                       st.none(), st.booleans()),
       event_type=st.one_of(st.none(), _text))
def test_events_are_refused_or_read_back_byte_for_byte(client: pgstreams.Client, key: Any, headers: Any,
                                                       value: Any, event_type: Any) -> None:
    topic = f"p{next(_counter)}"
    client.create_topic(topic, 2)
    try:
        client.publish(topic, value, key=key, headers=headers, event_type=event_type)
    except pgstreams.InvalidArgument as exc:
        _clean(str(exc))
        got = client.consumer(topic, "g").poll(max_events=10, timeout=0.05)
        assert got == []  # nothing stored
        return
    (event,) = client.consumer(topic, "g").poll(max_events=10, timeout=2.0)
    assert event.value == value and type(event.value) is type(value)
    assert event.key == key and event.event_type == event_type
    assert event.headers == (headers or {})


@_SETTINGS
@given(pool_size=st.one_of(st.integers(-2, 3), st.floats(), st.text(max_size=2), st.none()),
       poll_interval=st.one_of(st.floats(), st.integers(-1, 2), st.none()),
       retry_timeout=st.one_of(st.floats(), st.integers(-1, 100), st.text(max_size=2), st.booleans()))
def test_connect_options(dsn: str, pool_size: Any, poll_interval: Any, retry_timeout: Any) -> None:
    try:
        client = pgstreams.connect(dsn, pool_size=pool_size, poll_interval=poll_interval,
                                   retry_timeout=retry_timeout, migrate=False)
    except pgstreams.InvalidArgument as exc:
        _clean(str(exc))
        assert any(n in str(exc) for n in ("pool_size", "poll_interval", "retry_timeout"))
        return
    with client:
        assert client.retry_timeout == float(retry_timeout)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.lists(st.one_of(_text.filter(lambda s: "\x00" not in s and not any(
    0xD800 <= ord(c) <= 0xDFFF for c in s)), st.sampled_from(
        ["topics", "create", "grant", "--produce", "--consume", "--topic", "--admin", "revoke", "-p", "0",
         "--partitions", "describe", "delete", "--json", "produce", "'; DROP TABLE x; --"])),
    min_size=1, max_size=5))
def test_cli_arguments_never_show_a_traceback_or_sql(dsn: str, args: list[str]) -> None:
    before = db_state(dsn)
    done = subprocess.run([sys.executable, "-m", "pgstreams.cli", *args, "--dsn", dsn], capture_output=True,
                          text=True, timeout=120, input="")
    assert "Traceback" not in done.stderr
    assert not any(w in done.stderr for w in ("syntax error", "LINE 1", "SQLSTATE")), done.stderr
    if done.returncode != 0:
        assert done.stderr.startswith("error:") or "Usage" in done.stderr or done.stderr == "", done.stderr
        if done.returncode == 2:
            assert db_state(dsn) == before  # a refused command changed nothing


@pytest.mark.parametrize("dsn_form", ["uri", "keywords"])
def test_passwords_never_reach_errors_or_repr(dsn: str, dsn_form: str) -> None:
    secret = "Sup3r-secret-pw"
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    info = conninfo_to_dict(dsn)
    bad = make_conninfo(dsn, port="1", password=secret)  # nothing listens on port 1
    if dsn_form == "uri":
        bad = f"postgresql://{info.get('user', 'postgres')}:{secret}@127.0.0.1:1/x"
    with pytest.raises(pgstreams.ConfigurationError) as caught:
        pgstreams.connect(bad)
    assert secret not in str(caught.value) and secret not in repr(caught.value)
    assert caught.value.__cause__ is None or secret not in str(caught.value.__cause__)
    done = subprocess.run([sys.executable, "-m", "pgstreams.cli", "topics", "list", "--dsn", bad],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and secret not in done.stderr + done.stdout
    with pgstreams.connect(make_conninfo(dsn, password=secret)) as client:
        assert secret not in repr(client) and secret not in client.server
