"""The console in a real browser: headless Chromium (Debian's package) driven by Playwright, against
``pgstreams console`` as a subprocess, through every page (a share group's too) and the replay action,
with live updates; a screenshot of each page is saved by the run (see ``SCREENSHOTS`` in conftest)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pgstreams
from _console_data import fill
from _obs_helpers import server

DEADLINE_MS = 30_000


def _page(browser: Any) -> tuple[Any, list[str]]:
    """A new page (1280 x 900, actions waiting up to DEADLINE_MS) and the list its script errors go to."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(DEADLINE_MS)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    return page, errors


def _positions(page: Any, count: int) -> list[int]:
    """The positions of the first ``count`` rows of the event browser."""
    rows = page.locator("#events tr.event")
    return [int(rows.nth(i).locator("td").nth(1).inner_text()) for i in range(count)]


def test_pages_live_updates_and_replay_in_a_browser(dsn: str, browser: Any, screenshots: Path) -> None:
    where = fill(dsn)
    with server(["console", "--port", "0", "--refresh", "1", "--dsn", dsn], "serving the console at") as srv:
        page, errors = _page(browser)

        # overview: topics with their counts, groups; it updates itself
        page.goto(srv.url + "/")
        row = page.locator("#topics tr", has_text="orders").first
        assert row.locator("td").nth(2).inner_text() == "8"
        page.screenshot(path=str(screenshots / "overview.png"), full_page=True)
        with pgstreams.connect(dsn) as client:
            client.publish_many("orders", [{"value": i} for i in range(12)])
        page.wait_for_function(
            """() => [...document.querySelectorAll('#topics tr')].some(r => r.cells[0]
                   && r.cells[0].innerText.startsWith('orders') && r.cells[2].innerText === '20')""")
        page.wait_for_selector("#topics svg.spark")  # the publish-rate chart, once two samples are in
        page.screenshot(path=str(screenshots / "overview-live.png"), full_page=True)

        # a topic and its event browser
        page.click("#topics a:text-is('orders')")
        page.wait_for_url("**/topics/orders")
        assert page.locator("#partitions tbody tr").count() == 2
        page.select_option("#browse select[name=partition]", "0")
        page.select_option("#browse select[name=order]", "oldest")
        page.fill("#browse input[name=position]", "0")
        page.click("#browse button[type=submit]")
        page.wait_for_selector("#events")
        values = page.locator("#events pre.value")
        kinds = [values.nth(i).get_attribute("data-kind") for i in range(3)]
        assert kinds == ["json", "text", "bytes"]
        assert '"items": [' in values.nth(0).inner_text()
        assert values.nth(2).inner_text() == "00 ff 72 61 77"
        page.screenshot(path=str(screenshots / "topic.png"), full_page=True)
        page.goto(srv.url + "/topics/orders?position=abc")
        assert "position must be an integer" in page.inner_text("#error")
        page.goto(srv.url + "/topics/missing")
        assert "no topic named 'missing'" in page.inner_text("#error")
        page.screenshot(path=str(screenshots / "not-found.png"))

        # a group: its partitions, lag
        page.goto(srv.url + "/")
        page.click("#groups a:text-is('billing')")
        page.wait_for_url("**/groups/billing")
        lag = int(page.inner_text("#total-lag"))
        assert lag == 19
        page.screenshot(path=str(screenshots / "group.png"), full_page=True)

        # a share group: listed on the overview, its partitions on its page, which updates itself
        page.goto(srv.url + "/")
        assert page.locator("#share-groups tr", has_text="crew").locator("td").nth(2).inner_text() == "2"
        page.click("#share-groups a:text-is('crew')")
        page.wait_for_url("**/groups/crew")
        assert page.inner_text("h1") == "Share group crew"
        assert [page.inner_text(f"#share-{k}") for k in ("in-flight", "available", "dead-lettered")] == [
            "2", "3", "1"]
        assert page.locator("#share-partitions tbody tr").count() == 2
        assert page.inner_text("#share-oldest-lock").endswith("ago)")
        page.screenshot(path=str(screenshots / "share-group.png"), full_page=True)
        with pgstreams.connect(dsn) as client:
            more = client.share_consumer("jobs", "crew", lock_timeout=3600, max_deliveries=3)
            assert len(more.acquire(3)) == 3
        page.wait_for_function("() => document.querySelector('#share-in-flight').innerText === '5'")
        assert page.inner_text("#share-available") == "0"

        # dead letters: the list, one of them, replay it, then all
        page.goto(srv.url + "/dlt/payments.dlt")
        assert page.locator("#dead-letters tr.dead-letter").count() == 2
        assert "boom is not allowed" in page.inner_text("#dead-letters")
        page.screenshot(path=str(screenshots / "dead-letters.png"), full_page=True)
        page.click(f"a[href='/dlt/payments.dlt/0/{where['first']}']")
        page.wait_for_selector("#error-type")
        assert page.inner_text("#error-type") == "ValueError"
        page.screenshot(path=str(screenshots / "dead-letter.png"), full_page=True)
        page.click("#replay-one button")
        page.wait_for_selector("#message")
        assert page.inner_text("#message").startswith("replayed: payments[0]@")
        page.screenshot(path=str(screenshots / "replayed.png"), full_page=True)
        page.goto(srv.url + "/dlt/payments.dlt")
        page.click("#replay-all a")  # replay all asks first, saying how many
        page.wait_for_selector("#confirm")
        assert "2 dead letter(s) will be replayed to payments" in page.inner_text("#confirm-what")
        page.click("#confirm button")
        page.wait_for_selector("#message")
        assert "replayed 2 dead letter(s) of 2 read" in page.inner_text("#message")
        with pgstreams.connect(dsn) as client:
            copies = [e for e in client.read_events("payments", 0, limit=100)
                      if "dlt.replayed_from" in e.headers]
        assert len(copies) == 2  # the one replayed first was not published again
        assert errors == []
        for name in ("overview", "topic", "group", "share-group", "dead-letters", "dead-letter", "replayed"):
            assert (screenshots / f"{name}.png").stat().st_size > 1000


def test_event_browser_paging_search_group_actions_and_navigation_in_a_browser(
        dsn: str, browser: Any, screenshots: Path) -> None:
    with pgstreams.connect(dsn) as client:
        client.create_topic("clicks", 3)
        client.publish_many("clicks", [{"value": {"n": i}, "key": f"user-{i % 7}", "partition": i % 3}
                                       for i in range(1200)])
        for group in ("reader", "gone"):
            consumer = client.consumer("clicks", group)
            while consumer.poll(max_events=1000, timeout=0.5):
                consumer.commit()
        heads = {p.partition: p.head for p in client.describe_topic("clicks").partition_info}
    newest = max(h for h in heads.values() if h is not None)
    with server(["console", "--port", "0", "--refresh", "60", "--dsn", dsn], "serving the console at") as srv:
        page, errors = _page(browser)

        # the navigation bar on every page; counts with thousands separators; sparkline scales
        page.goto(srv.url + "/")
        assert [a.inner_text() for a in page.locator("#nav a").all()][:3] == ["Overview", "Topics", "Groups"]
        assert page.locator("#topics tr", has_text="clicks").locator("td").nth(2).inner_text() == "1,200"

        # a topic's page: its groups with their lag and state, its dead letters, its configuration
        page.click("#nav a:text-is('Topics')")
        page.click("#topics a:text-is('clicks')")
        page.wait_for_url("**/topics/clicks")
        groups = page.locator("#topic-groups tbody tr")
        assert groups.count() == 2 and "Empty" in groups.first.inner_text()
        assert "no clicks.dlt topic" in page.inner_text("#topic-dlt")
        assert "retention.ms" in page.inner_text("#config") and "default" in page.inner_text("#config")

        # the event browser: newest first, every partition at once, paging both ways
        rows = page.locator("#events tr.event")
        assert rows.count() == 20
        shown = _positions(page, 20)
        assert shown == sorted(shown, reverse=True) and shown[0] == newest
        assert len({rows.nth(i).locator("td").first.inner_text() for i in range(20)}) == 3  # all partitions
        page.screenshot(path=str(screenshots / "browser-newest.png"), full_page=True)
        page.click("#page-older")
        older = _positions(page, 20)
        assert older == sorted(older, reverse=True) and older[0] < shown[-1]
        page.click("#page-newer")
        again = _positions(page, 20)
        assert again == shown
        # a jump to a position, oldest first
        page.select_option("#browse select[name=order]", "oldest")
        page.fill("#browse input[name=position]", "100")
        page.click("#browse button[type=submit]")
        assert _positions(page, 1) == [100]

        # search by key, bounded, with its cost stated
        page.goto(srv.url + "/topics/clicks?key=user-3&limit=5")
        found = page.locator("#events tr.event")
        assert found.count() == 5 and all(found.nth(i).locator("td").nth(3).inner_text() == "user-3"
                                          for i in range(5))
        assert "at most 10,000 events of each partition" in page.inner_text("#search-cost")
        page.screenshot(path=str(screenshots / "browser-search.png"), full_page=True)

        # a group reset, behind a confirmation that shows each partition's move
        page.goto(srv.url + "/groups/reader")
        page.select_option("#reset select[name=to]", "earliest")
        page.click("#reset button[type=submit]")
        page.wait_for_selector("#reset-plan")
        assert page.locator("#reset-plan tbody tr").count() == 3
        assert "move to the oldest retained event" in page.inner_text("#confirm-what")
        with pgstreams.connect(dsn) as client:  # nothing moved yet
            assert sum(s.lag for s in client.describe_group("reader", "clicks")) == 0
        page.screenshot(path=str(screenshots / "confirm-reset.png"), full_page=True)
        page.click("#confirm button")
        page.wait_for_selector("#message")
        assert "3 of 3 partition(s) moved" in page.inner_text("#message")
        assert page.inner_text("#total-lag") == "1,200"

        # deleting a group, behind a confirmation
        page.goto(srv.url + "/groups/gone")
        page.click("#delete")
        page.wait_for_selector("#confirm")
        assert "3 checkpoint(s) on clicks" in page.inner_text("#confirm-what")
        page.click("#confirm button")
        page.wait_for_selector("#message")
        assert "deleted group gone" in page.inner_text("#message")
        assert page.locator("#groups a:text-is('gone')").count() == 0
        # a request without the form's CSRF token changes nothing
        refused = page.request.post(srv.url + "/groups/reader/delete", form={"csrf": "wrong"})
        assert refused.status == 403
        with pgstreams.connect(dsn) as client:
            assert client.describe_group("reader", "clicks")
        assert errors == []
