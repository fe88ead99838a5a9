"""Hot statements straight through libpq: prepared once per connection, and prepared again when the server
lost some of them."""

from __future__ import annotations

import psycopg

import pgstreams
from pgstreams.storage.libpq import Direct, Step, int_array, statement


def _steps(tid: int, head: int) -> list[Step]:
    text = {"partitions": int_array([0, 1]), "positions": int_array([head, head]), "limit": b"10",
            "total": b"10"}
    out: list[Step] = []
    for q in ("generic_plans", "load_fences", "poll"):
        st = statement(q, "pgstreams", tid)
        out.append((st, [text[n] for n in st.params], 1 if q == "poll" else 0))
    return out


def test_a_pipeline_survives_the_server_losing_some_or_all_of_its_statements(client: pgstreams.Client,
                                                                             dsn: str) -> None:
    client.create_topic("t", 2)
    for i in range(3):
        client.publish("t", i, partition=i % 2)
    tid = client.topic_state("t").id
    direct = Direct()
    with psycopg.connect(dsn, autocommit=True) as conn:
        steps = _steps(tid, 0)
        first = direct.pipeline(conn, steps)
        assert len(first[2]) == 3
        # one statement deallocated behind the registry's back (psycopg deallocates its own, or all)
        conn.pgconn.exec_params(b"DEALLOCATE " + steps[2][0].name, None)
        assert direct.pipeline(conn, steps) == first
        conn.execute("DEALLOCATE ALL")
        assert direct.pipeline(conn, steps) == first
