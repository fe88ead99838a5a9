"""``pgstreams console`` over HTTP, as a real subprocess: every route, bad input, the replay action with
its CSRF check, and the safety rules (loopback unless credentials, authentication)."""

from __future__ import annotations

import base64
import html
import os
import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request

import pgstreams
from _console_data import fill
from _obs_helpers import CLI, TESTS, server

READY = "serving the console at"


def fetch(url: str, data: dict[str, str] | None = None, headers: dict[str, str] | None = None
          ) -> tuple[int, str]:
    body = None if data is None else urllib.parse.urlencode(data).encode()
    req = urllib.request.Request(url, data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, html.unescape(resp.read().decode())
    except urllib.error.HTTPError as exc:
        return exc.code, html.unescape(exc.read().decode())


def console(dsn: str, *extra: str, env: dict[str, str] | None = None):
    return server(["console", "--port", "0", "--dsn", dsn, *extra], READY, env=env)


def table(page: str, table_id: str) -> list[list[str]]:
    """The body rows of table ``table_id`` of ``page``, each as its cells' text."""
    m = re.search(rf'<table[^>]*id="{table_id}"[^>]*>(.*?)</table>', page, re.S)
    assert m, f"no table {table_id} in the page"
    body = m.group(1).split("<tbody>", 1)[1]
    return [[re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", cell)).strip()
             for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)]


def strong(page: str, element_id: str) -> str:
    m = re.search(rf'id="{element_id}"[^>]*>(.*?)</', page, re.S)
    assert m, f"no element {element_id} in the page"
    return m.group(1).strip()


def test_every_route_and_bad_input(dsn: str) -> None:
    where = fill(dsn)
    with console(dsn) as srv:
        assert srv.url.startswith("http://127.0.0.1:")
        base = srv.url
        code, page = fetch(base + "/")
        assert code == 200 and "orders" in page and "payments.dlt" in page and "billing" in page
        code, page = fetch(base + "/topics/orders")
        assert code == 200 and 'id="partitions"' in page
        code, page = fetch(base + "/topics/orders?partition=0&position=0&limit=10")
        assert code == 200
        assert "customer-1" in page and "OrderPlaced" in page and "order-1" in page and "corr-1" in page
        assert "source: web" in page
        assert '"items": [\n' in page  # JSON pretty-printed
        assert "plain text" in page
        assert "00 ff 72 61 77" in page  # bytes as hex
        code, page = fetch(base + "/topics/orders?partition=1&time=2000-01-01T00:00:00Z")
        assert code == 200 and page.count('class="event"') == 5
        code, page = fetch(base + "/groups/billing")
        assert code == 200 and 'id="partitions"' in page and "orders" in page
        code, page = fetch(base + "/groups/payer")
        assert code == 200 and "payments" in page and "No registered members" in page  # the worker left
        code, page = fetch(base + "/dlt/payments.dlt")
        assert code == 200 and "ValueError" in page and "boom is not allowed" in page
        # share groups: listed on the overview (with the queue), each one's partitions on its page
        code, page = fetch(base + "/")
        shares = {row[0]: row for row in table(page, "share-groups")}
        assert set(shares) == {"crew", "mail queue"}
        # group, topics, in flight, available, waiting, delivered too often, dead-lettered, oldest lock, state
        assert shares["crew"][1:7] == ["jobs", "2", "3", "0", "0", "1"]
        assert shares["crew"][7].endswith(" ago") and shares["crew"][8] == "ok"
        assert shares["mail queue"][1:8] == ["mail", "0", "2", "0", "0", "0", "none"]
        assert 'href="/groups/crew"' in page and 'href="/groups/mail"' in page
        code, page = fetch(base + "/groups/crew")
        assert code == 200 and "Share group crew" in page
        assert [strong(page, f"share-{k}") for k in ("in-flight", "available", "waiting", "too-often",
                                                     "dead-lettered")] == ["2", "3", "0", "0", "1"]
        lock = strong(page, "share-oldest-lock")
        assert re.match(r"\d{4}-\d\d-\d\dT[0-9:.]+Z \([0-9.]+ (s|min) ago\)$", lock), lock
        assert "at most 3 deliveries, locks of 1h" in page and 'href="/dlt/jobs.dlt"' in page
        rows = table(page, "share-partitions")
        assert [(r[0], r[1]) for r in rows] == [("jobs", "0"), ("jobs", "1")]
        with pgstreams.connect(dsn) as client:
            described = client.describe_share_group("crew")
        # topic, partition, start, frontier, head, in flight, available, waiting, too often, lock, rejected,
        # dead-lettered
        assert [[int(r[i]) for i in (3, 4, 5, 6, 7, 8, 10, 11)] for r in rows] == [
            [s.frontier, s.head, s.acquired, s.available, s.waiting, s.delivered_too_often, s.rejected,
             s.dead_lettered] for s in described]
        assert sum(int(r[5]) for r in rows) == 2 and sum(int(r[6]) for r in rows) == 3
        assert [bool(r[9]) for r in rows] == [s.oldest_lock is not None for s in described]
        assert 'id="partitions"' not in page and 'id="members"' not in page  # no stream-group part
        code, page = fetch(base + "/groups/mail")
        assert code == 200 and '<span class="tag">queue</span>' in page
        assert strong(page, "share-available") == "2" and strong(page, "share-oldest-lock") == "none"
        code, page = fetch(base + "/groups/billing")
        assert code == 200 and 'id="share-partitions"' not in page  # a stream group only
        code, page = fetch(base + "/dlt/jobs.dlt")
        assert code == 200 and "not a job we do" in page
        code, page = fetch(base + f"/dlt/payments.dlt/0/{where['first']}")
        assert code == 200 and "boom is not allowed" in page and 'id="replay-one"' in page
        for path, what in (("/topics/nope", "no topic named 'nope'"),
                           ("/groups/nope", "no group named 'nope'"),
                           ("/dlt/nope", "no topic named 'nope'"), ("/topics/bad%20name", "no topic named"),
                           ("/dlt/payments.dlt/0/999999", "no event at partition 0, position 999999"),
                           ("/nowhere", "Not Found")):
            code, page = fetch(base + path)
            assert code == 404, (path, code)
            assert what in page, (path, page)
        for query, why in (("position=abc", "position must be an integer, not 'abc'"),
                           ("position=-1", "position must be >= 0"),
                           ("partition=9", "partition must be from 0 to 1, not 9"),
                           ("time=yesterday", "time must be an ISO 8601 time"),
                           ("time=2026-01-01T00:00:00", "has no time zone"),
                           ("position=1&time=2026-01-01T00:00:00Z", "not several"),
                           ("before=3&after=1", "not several"),
                           ("order=up", "order must be newest or oldest, not 'up'"),
                           ("key=k&after=3", "give before, not after"),
                           ("limit=5000", "limit must be at most 1000")):
            code, page = fetch(base + "/topics/orders?" + query)
            assert code == 400, (query, code)
            assert why in page, (query, page)


def _csrf(page: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', page)
    assert m, "no CSRF field in the page"
    return m.group(1)


def _copies(dsn: str) -> list[pgstreams.Event]:
    with pgstreams.connect(dsn) as client:
        return [e for e in client.read_events("payments", 0, limit=100) if "dlt.replayed_from" in e.headers]


def test_replay_is_a_csrf_checked_post_and_happens_once(dsn: str) -> None:
    where = fill(dsn)
    with console(dsn) as srv:
        one = f"{srv.url}/dlt/payments.dlt/0/{where['first']}"
        code, page = fetch(one + "/replay", {"csrf": "forged"})
        assert code == 403 and "CSRF" in page
        code, _ = fetch(one + "/replay", {})
        assert code == 403
        code, _ = fetch(one + "/replay")  # a GET changes nothing
        assert code in (404, 405)
        assert _copies(dsn) == []
        token = _csrf(fetch(one)[1])
        code, _ = fetch(one + "/replay", {"csrf": token}, {"Origin": "http://evil.example"})
        assert code == 403 and _copies(dsn) == []
        code, page = fetch(one + "/replay", {"csrf": token})
        assert code == 200 and "replayed: payments[0]@" in page
        copies = _copies(dsn)
        assert len(copies) == 1 and copies[0].value == {"boom": True}
        assert copies[0].headers["dlt.replayed_from"] == f"payments.dlt/0/{where['first']}"
        assert not any(k.startswith("dlt.") and k not in ("dlt.replayed_from", "dlt.replayed_at")
                       for k in copies[0].headers)
        code, page = fetch(one + "/replay", {"csrf": token})
        assert code == 200 and "was replayed already" in page
        assert len(_copies(dsn)) == 1
        code, page = fetch(srv.url + "/dlt/payments.dlt/replay", {"csrf": token})
        assert code == 200 and "replayed 2 dead letter(s) of 2 read" in page
        assert sorted(e.headers["dlt.replayed_from"] for e in _copies(dsn)) == sorted(
            f"payments.dlt/0/{p}" for p in where.values())  # the first one was not published twice
        code, page = fetch(srv.url + "/dlt/payments.dlt")
        assert page.count(">replayed<") == 2


def test_non_loopback_needs_credentials_and_credentials_are_required(dsn: str) -> None:
    p = subprocess.run([*CLI, "console", "--host", "0.0.0.0", "--port", "0", "--dsn", dsn], cwd=TESTS,
                       capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in os.environ.items() if not k.startswith("PGSTREAMS_CONSOLE")})
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert "not a loopback address" in p.stderr and "PGSTREAMS_CONSOLE_TOKEN" in p.stderr
    p = subprocess.run([*CLI, "console", "--port", "70000", "--dsn", dsn], cwd=TESTS, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "--port" in p.stderr and "Traceback" not in p.stderr
    with pgstreams.connect(dsn) as client:
        client.create_topic("t", 1)
    with console(dsn, env={"PGSTREAMS_CONSOLE_TOKEN": "s3cret-token"}) as srv:
        assert fetch(srv.url + "/")[0] == 401
        assert fetch(srv.url + "/", headers={"Authorization": "Bearer wrong"})[0] == 401
        code, page = fetch(srv.url + "/", headers={"Authorization": "Bearer s3cret-token"})
        assert code == 200 and "s3cret-token" not in page
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        with opener.open(srv.url + "/topics/t?token=s3cret-token", timeout=60) as resp:
            assert resp.status == 200 and "token=" not in resp.url  # kept in a cookie from then on
        with opener.open(srv.url + "/", timeout=60) as resp:
            assert resp.status == 200
    creds = {"PGSTREAMS_CONSOLE_USER": "admin", "PGSTREAMS_CONSOLE_PASSWORD": "pa55word"}
    with console(dsn, env=creds) as srv:
        code, _ = fetch(srv.url + "/")
        assert code == 401
        good = base64.b64encode(b"admin:pa55word").decode()
        bad = base64.b64encode(b"admin:nope").decode()
        assert fetch(srv.url + "/", headers={"Authorization": f"Basic {bad}"})[0] == 401
        code, page = fetch(srv.url + "/", headers={"Authorization": f"Basic {good}"})
        assert code == 200 and "pa55word" not in page
    assert "pa55word" not in srv.output and "s3cret" not in srv.output


def test_the_overview_shows_each_captures_slot_lag_wal_status_and_safe_wal_size(cdc_dsn: str) -> None:
    with pgstreams.connect(cdc_dsn) as client:
        with client.connection() as conn:
            conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
            conn.execute("CREATE TABLE gone (id int PRIMARY KEY)")
            conn.execute("INSERT INTO orders SELECT generate_series(1, 300)")
        client.cdc.add(["orders"], topic_prefix="shop")
        client.cdc.snapshot(["orders"], capture="shop", chunk_size=100)
        client.cdc.capture("shop")
        client.cdc.add(["gone"], topic_prefix="old")
        client.cdc.guard(0, drop=True)  # drops the slot of "old" (nobody reads it) and of "shop"
        client.cdc.add(["orders"], topic_prefix="live")
        with console(cdc_dsn) as srv:
            code, page = fetch(srv.url + "/")
            assert code == 200
            rows = {r[0]: r for r in table(page, "captures")}
            live = client.cdc.describe("live")
    assert set(rows) == {"live", "old", "shop"}
    # capture, tables, changes, confirmed, slot, lag, retained WAL, wal_status, safe_wal_size, snapshots
    assert rows["live"][1:5] == ["public.orders", "0", live.confirmed_lsn, "idle"]
    assert rows["live"][5].endswith(("B", "KiB", "MiB")) and rows["live"][7] == live.wal_status
    assert rows["live"][8] == "no limit" and rows["live"][9] == ""
    assert rows["shop"][2] == "300" and rows["shop"][4] == "dropped" and rows["shop"][5:9] == ["", "", "", ""]
    assert rows["shop"][9] == "public.orders 300 rows done"
