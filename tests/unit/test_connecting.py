"""DSN resolution: one rule (pgstreams.connecting) for connect(), the command line and the Spark options."""

from __future__ import annotations

import pytest

from pgstreams.cli.common import CliError, resolve, resolve_all
from pgstreams.connecting import LIBPQ_SERVER_VARIABLES, resolve_dsn, resolve_dsns
from pgstreams.errors import InvalidArgument
from pgstreams.pooler import check_listen_dsn, check_pooler, connection_options
from pgstreams.spark._options import read_options, write_options

A = "postgresql://u@127.0.0.1:5432/a"
B = "host=127.0.0.1 port=5433 dbname=b"


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGSTREAMS_DSN", raising=False)
    for name in LIBPQ_SERVER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_argument_then_pgstreams_dsn_then_libpq_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGSTREAMS_DSN", B)
    assert resolve_dsn(A) == A  # the argument wins
    assert resolve_dsn(None) == B
    monkeypatch.delenv("PGSTREAMS_DSN")
    monkeypatch.setenv("PGHOST", "127.0.0.1")
    assert resolve_dsn(None).strip() == ""  # an empty conninfo: libpq reads its environment
    assert resolve_dsns(None) == [resolve_dsn(None)]


def test_several_dsns_as_a_list_or_separated_by_commas(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_dsns([A, B]) == [A, B]
    assert resolve_dsns(f"{A},{B}") == [A, B]
    # libpq's multi-host DSNs stay one server
    assert resolve_dsns("host=a,b dbname=x") == ["host=a,b dbname=x"]
    assert resolve_dsns("postgresql://a,b/x") == ["postgresql://a,b/x"]
    monkeypatch.setenv("PGSTREAMS_DSN", f"{A}, {B}")
    assert resolve_dsns(None) == [A, B]


@pytest.mark.parametrize(("dsn", "message"), [
    ("", "must not be empty"),
    ("   ", "must not be empty"),
    ([], "at least one shard"),
    ([A, ""], "shard 1: the DSN is empty"),
    ([A, "host='unterminated"], "shard 1: invalid DSN"),
    (7, "must be a string or a list"),
])
def test_bad_dsns_are_refused_naming_the_problem(dsn: object, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        resolve_dsns(dsn)  # type: ignore[arg-type]


def test_the_command_line_resolves_as_connect_does(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve([A]) == A
    assert resolve_all([f"{A},{B}"]) == [A, B]  # one --dsn holding the shards
    assert resolve_all([A, B]) == [A, B]  # --dsn repeated
    with pytest.raises(CliError, match="works on one server, but 2 DSNs") as info:
        resolve([f"{A},{B}"])
    assert info.value.exit_code == 2
    monkeypatch.setenv("PGSTREAMS_DSN", f"{A},{B}")
    assert resolve_all(None) == [A, B]
    with pytest.raises(CliError, match="works on one server"):
        resolve(None)


def test_the_spark_options_resolve_as_connect_does(monkeypatch: pytest.MonkeyPatch) -> None:
    assert read_options({"dsn": A, "topic": "t"}).dsn == A
    monkeypatch.setenv("PGSTREAMS_DSN", B)
    assert read_options({"topic": "t"}).dsn == B  # no option: the environment, as connect()
    assert write_options({"topic": "t"}).dsn == B
    assert read_options({"dsn": f"{A},{B}", "topic": "t"}).dsn == f"{A},{B}"
    monkeypatch.delenv("PGSTREAMS_DSN")
    monkeypatch.setenv("PGSERVICE", "pgstreams-test")
    assert read_options({"topic": "t"}).dsn.strip() == ""  # libpq's environment
    with pytest.raises(InvalidArgument, match="option 'dsn': shard 1: invalid DSN"):
        read_options({"dsn": f"{A},host='unterminated", "topic": "t"})


def test_the_pooler_mode_is_session_or_transaction_and_anything_else_is_named_in_the_error() -> None:
    assert check_pooler(None) == check_pooler("session") == check_pooler(" Session ") == "session"
    assert check_pooler("transaction") == "transaction"
    for bad in ("bogus", "statement", "", 0, True, ["transaction"]):
        with pytest.raises(InvalidArgument, match="pooler must be one of 'session', 'transaction' or None"):
            check_pooler(bad)
    # behind a transaction pooler psycopg prepares nothing; otherwise its default
    assert connection_options("transaction") == {"autocommit": True, "prepare_threshold": None}
    assert "prepare_threshold" not in connection_options("session")


def test_a_listen_dsn_must_be_a_dsn_and_its_password_stays_out_of_the_error() -> None:
    assert check_listen_dsn(None) is None
    assert check_listen_dsn(A) == A
    with pytest.raises(InvalidArgument, match="listen_dsn must not be empty"):
        check_listen_dsn(" ")
    with pytest.raises(InvalidArgument, match="listen_dsn must be a DSN string or None, not int"):
        check_listen_dsn(5)
    with pytest.raises(InvalidArgument, match="listen_dsn is not a valid DSN") as info:
        check_listen_dsn("host=a password=hunter2 bogus=1")
    assert "hunter2" not in str(info.value)


def test_the_spark_option_pooler_and_the_command_line_option_name_themselves() -> None:
    assert read_options({"dsn": A, "topic": "t"}).pooler == "session"
    assert read_options({"dsn": A, "topic": "t", "pooler": "transaction"}).pooler == "transaction"
    assert write_options({"dsn": A, "topic": "t", "pooler": "TRANSACTION"}).pooler == "transaction"
    with pytest.raises(InvalidArgument, match="option 'pooler' must be one of 'session' or 'transaction' "):
        read_options({"dsn": A, "topic": "t", "pooler": "bogus"})
    with pytest.raises(InvalidArgument, match="--pooler must be one of"):
        check_pooler("bogus", "--pooler")
