"""The storage layer's loader, naming and migration rendering, without a database."""

from __future__ import annotations

import pytest
from psycopg.types.json import Jsonb

from pgstreams import InvalidName
from pgstreams.storage import (
    CORE,
    CORE_QUERIES,
    QueryNotFound,
    QuerySet,
    TopicTables,
    core_query,
    render_script,
)
from pgstreams.storage.events import SINGLE_KEY_TOPICS, insert_params, insert_statement, single_key
from pgstreams.storage.queries import parse


def test_query_files_split_by_name_and_refuse_a_name_defined_twice() -> None:
    text = "-- header comment\n-- name: one\nSELECT 1;\n\n-- name: two\nSELECT {schema}.f(%s);\n"
    assert parse(text) == {"one": "SELECT 1", "two": "SELECT {schema}.f(%s)"}
    with pytest.raises(ValueError, match="'one' is defined twice"):
        parse(text + "-- name: one\nSELECT 2;\n")


def test_every_core_query_renders_with_quoted_identifiers() -> None:
    tables = TopicTables("my schema", 7)
    for name in CORE_QUERIES.names():
        if "{segment}" in CORE_QUERIES.text(name):  # one segment's DDL (retention): rendered per segment
            rendered = CORE_QUERIES.render(name, "my schema", {**tables.identifiers,
                                                               "segment": tables.segment(3)}).as_string(None)
            assert '"my schema"."topic_7_s3"' in rendered, name
        else:
            rendered = core_query(name, "my schema", 7).as_string(None)
        assert "{schema}" not in rendered and "{table}" not in rendered and "{seq}" not in rendered, name
    assert '"my schema"."topic_7"' in core_query("poll", "my schema", 7).as_string(None)
    with pytest.raises(QueryNotFound, match="no_such_query"):
        QuerySet("pgstreams.storage", "sql", "queries").text("no_such_query")


def test_topic_tables_name_the_table_segments_and_sequence() -> None:
    tables = TopicTables("pgstreams", 12)
    assert tables.table.as_string(None) == '"pgstreams"."topic_12"'
    assert tables.sequence.as_string(None) == '"pgstreams"."topic_12_seq"'
    assert tables.segment(3).as_string(None) == '"pgstreams"."topic_12_s3"'
    assert tables.sequence_regclass == '"pgstreams"."topic_12_seq"'


def test_migrations_render_the_schema_quoted_and_bare_and_undouble_braces() -> None:
    text = "CREATE TABLE {schema}.t (c jsonb DEFAULT '{{}}');\nSELECT '{schema_raw}';"
    assert render_script(text, "s1").as_string(None) == (
        "CREATE TABLE \"s1\".t (c jsonb DEFAULT '{}');\nSELECT 's1';")
    with pytest.raises(InvalidName):
        render_script(text, "bad'schema")
    for migration in CORE.available():  # every shipped migration renders
        assert "{schema" not in render_script(migration.text, "pgstreams").as_string(None)
    assert [m.version for m in CORE.available()] == sorted(m.version for m in CORE.available())


def test_a_single_publish_binds_only_the_columns_it_sets_and_the_single_key() -> None:
    """Events without headers, type, correlation or causation id take the lean insert; the last parameter
    of both single-key inserts is (7 << 60) | (partition << 50) | (topic id << 40), as readers decode it
    (0006_single_key_publish.sql); topics beyond the single key's range take insert_event."""
    plain = (3, "b", "k", b"v", None, None, None, None, None, 42)
    typed = (3, "b", None, b"v", Jsonb({"h": "1"}), "created", None, None, None, None)
    lean = insert_statement("pgstreams", 5, plain)
    full = insert_statement("pgstreams", 5, typed)
    assert lean.statement.name.startswith(b"pgstreams_insert_event_own_lean_")
    assert full.statement.name.startswith(b"pgstreams_insert_event_own_") and full != lean
    key = b"%d" % ((7 << 60) | (3 << 50) | (5 << 40))
    assert single_key(5, 3) == int(key)
    assert insert_params(plain, "utf-8", lean) == [b"3", b"b", b"k", b"v", b"42", key]
    assert insert_params(typed, "utf-8", full) == [b"3", b"b", None, b"v", b'{"h": "1"}', b"created", None,
                                                   None, None, None, key]
    assert len(lean.oids) == len(lean.formats) == 6 and len(full.oids) == len(full.formats) == 11
    big = insert_statement("pgstreams", SINGLE_KEY_TOPICS, plain)
    assert big.statement.name.startswith(b"pgstreams_insert_event_")
    assert insert_params(plain, "utf-8", big) == [b"3", b"3", b"b", b"k", b"v", None, None, None, None, None,
                                                  b"42"]


def test_the_capture_queries_render_their_identifiers_quoted() -> None:
    from psycopg import sql

    from pgstreams.storage.cdc import CDC_QUERIES

    rendered = CDC_QUERIES.render("cdc_publication_add", "s", {
        "publication": sql.Identifier("p x"), "tables": sql.Identifier("my schema", "t")}).as_string(None)
    assert rendered == 'ALTER PUBLICATION "p x" ADD TABLE "my schema"."t"'
    snap = CDC_QUERIES.render("cdc_set_snapshot", "s", {"snapshot": sql.Literal("00000003-1'")})
    assert snap.as_string(None) == "SET TRANSACTION SNAPSHOT '00000003-1'''"
