"""The console's web application (Starlette, server-rendered Jinja2 templates, no JavaScript build
step): routes, authentication and CSRF checks, error pages."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

try:
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
    from starlette.requests import Request
    from starlette.responses import RedirectResponse, Response
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles
    from starlette.templating import Jinja2Templates
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError('pgstreams.console needs its extra: pip install "pgstreams[console]"') from exc

from .. import group_members
from ..client import Client
from ..errors import GroupActive, GroupNotFound, InvalidArgument, InvalidName, PgStreamsError, TopicNotFound
from ..models import Event, GroupLag, ShareGroupStatus, StatusSnapshot, group_state
from ..names import check_group, check_topic
from . import render
from .defaults import DEFAULT_HISTORY_MINUTES, DEFAULT_REFRESH
from .history import History
from .security import TOKEN_COOKIE, Credentials

_HERE = Path(__file__).resolve().parent
#: Dead letters listed per partition on a dead-letter page.
DLT_PAGE = 100
#: The group whose checkpoint records a replay of every dead letter (as ``pgstreams dlt replay``).
_REPLAY_GROUP = "pgstreams-dlt-replay"


class NotFound(HTTPException):
    """A 404 page naming what does not exist."""

    def __init__(self, detail: str) -> None:
        super().__init__(404, detail)


class Conflict(HTTPException):
    """A 409 page: the action is refused in the state things are in (a group with live members)."""

    def __init__(self, detail: str) -> None:
        super().__init__(409, detail)


class BadRequest(HTTPException):
    """A 400 page naming what is wrong with the request."""

    def __init__(self, detail: str) -> None:
        super().__init__(400, detail)


class _Auth(BaseHTTPMiddleware):
    """Authentication (when credentials are set) and CSRF checks of POSTs."""

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        creds: Credentials = request.app.state.credentials
        if creds.required and not request.url.path.startswith("/static/"):
            query_token = request.query_params.get("token")
            if creds.token is not None and query_token is not None and creds.accepts(
                    f"Bearer {query_token}", None):
                url = request.url.remove_query_params("token")
                resp = RedirectResponse(str(url), status_code=303)
                resp.set_cookie(TOKEN_COOKIE, query_token, httponly=True, samesite="strict")
                return resp
            if not creds.accepts(request.headers.get("authorization"), request.cookies.get(TOKEN_COOKIE)):
                headers = {"WWW-Authenticate": 'Basic realm="pgstreams console"'} if creds.user else {}
                return Response("authentication required", status_code=401, headers=headers,
                                media_type="text/plain")
        return await call_next(request)


async def _check_csrf(request: Request) -> dict[str, Any]:
    """The POSTed form, after checking its CSRF token (and the Origin header, when sent)."""
    form = dict(await request.form())
    token = str(form.get("csrf", ""))
    expected: str = request.app.state.csrf
    if not hmac_equal(token, expected):
        raise HTTPException(403, "the form's CSRF token is missing or wrong: reload the page and try again")
    origin = request.headers.get("origin")
    if origin and origin not in (f"{request.url.scheme}://{request.url.netloc}", "null"):
        raise HTTPException(403, f"cross-site request from {origin} refused")
    return form


def _time(text: str) -> datetime:
    """A time given in a page's query or form: ISO 8601 with a zone (``Z`` or ``+HH:MM``)."""
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BadRequest(f"time must be an ISO 8601 time with a zone, not {text!r}") from None
    if at.tzinfo is None:
        raise BadRequest(f"time {text!r} has no time zone (add Z or +HH:MM)")
    return at


def hmac_equal(a: str, b: str) -> bool:
    """Constant-time string comparison."""
    return secrets.compare_digest(a.encode(), b.encode())


def _int(request: Request, name: str, *, low: int = 0) -> int | None:
    text = request.query_params.get(name)
    if text is None or text == "":
        return None
    try:
        n = int(text)
    except ValueError:
        raise BadRequest(f"{name} must be an integer, not {text!r}") from None
    if n < low:
        raise BadRequest(f"{name} must be >= {low}, not {n}")
    return n


class Console:
    """The pages, over one :class:`pgstreams.Client`."""

    def __init__(self, client: Client, history: History, refresh: float) -> None:
        self.client = client
        self.history = history
        self.refresh = refresh
        self.templates = Jinja2Templates(directory=str(_HERE / "templates"))
        env = self.templates.env
        env.filters["when"] = render.when
        env.filters["count"] = render.count
        env.filters["size"] = render.size
        env.filters["duration"] = render.duration
        env.globals["age"] = render.age
        env.globals["sparkline"] = render.sparkline
        env.globals["value_text"] = render.value_text

    def page(self, request: Request, template: str, status_code: int = 200, **context: Any) -> Response:
        # message: what the action a page redirected from did (shown by base.html)
        context.update(request=request, refresh=self.refresh, csrf=request.app.state.csrf,
                       schema=self.client.schema, message=request.query_params.get("message"))
        return self.templates.TemplateResponse(request, template, context, status_code=status_code)

    def _snapshot(self) -> StatusSnapshot:
        snap = self.client.status()
        self.history.record(snap)
        return snap

    def _topic(self, name: str) -> str:
        try:
            check_topic(name)
            return self.client.topic_state(name, refresh=True).name
        except (InvalidName, TopicNotFound):
            raise NotFound(f"there is no topic named {name!r}") from None

    # -- pages -----------------------------------------------------------------------------------------
    def overview(self, request: Request) -> Response:
        snap = self._snapshot()
        per_topic: dict[str, dict[str, int]] = {}
        for p in snap.partitions:
            t = per_topic.setdefault(p.topic, {"events": 0, "published": 0})
            t["events"] += p.events
            t["published"] += p.published
        groups = _group_rows(snap.groups)
        rates = {t.topic: self.history.rates(t.topic) for t in snap.topics}
        return self.page(request, "overview.html", snap=snap, per_topic=per_topic, groups=groups, rates=rates,
                         shares=_share_groups(snap.shares), captures=self.client.cdc.list())

    def topic(self, request: Request) -> Response:
        name = self._topic(request.path_params["name"])
        desc = self.client.describe_topic(name)
        browse = self._browse(request, name, desc.topic.partitions)
        snap = self._snapshot()
        # the size of the overview and the metrics (the status): segments, indexes and TOAST
        status = next((t for t in snap.topics if t.topic == name), None)
        groups = _group_rows(g for g in snap.groups if g.topic == name)
        dlt = next((t for t in snap.topics if t.topic == f"{name}.dlt"), None)
        dlt_events = sum(p.events for p in snap.partitions if dlt is not None and p.topic == dlt.topic)
        return self.page(request, "topic.html", desc=desc, status=status, rates=self.history.rates(name),
                         groups=groups, dlt=dlt, dlt_events=dlt_events, **browse)

    def _browse(self, request: Request, name: str, partitions: int) -> dict[str, Any]:
        """The event browser's query (see docs/console.md): which partitions (``partition``, default
        all), the order shown (``order``: ``newest``, the default, or ``oldest``), a page boundary
        (``before`` or ``after``, exclusive), a jump (``position`` or ``time``: the page that starts
        there), a key to search for (``key``, a bounded walk of :data:`SEARCH_SCAN` events per partition,
        back from ``before`` or the end) and ``limit``."""
        q = request.query_params
        part_text = q.get("partition") or ""
        partition = None if part_text in ("", "all") else _int(request, "partition")
        if partition is not None and partition >= partitions:
            raise BadRequest(f"partition must be from 0 to {partitions - 1}, not {partition}")
        parts = list(range(partitions)) if partition is None else [partition]
        order = q.get("order") or "newest"
        if order not in ("newest", "oldest"):
            raise BadRequest(f"order must be newest or oldest, not {order!r}")
        limit = _int(request, "limit", low=1) or 20
        if limit > 1000:
            raise BadRequest(f"limit must be at most 1000, not {limit}")
        before, after, position = _int(request, "before"), _int(request, "after"), _int(request, "position")
        at_text = q.get("time") or None
        key = q.get("key") or None
        at = None if at_text is None else _time(at_text)
        if sum(x is not None for x in (before, after, position, at)) > 1:
            raise BadRequest("give one of a position, a time, before or after, not several")
        if at is not None:  # a jump to a time: from the first event at or after it, in any partition
            found = [p for p in (self.client.read_events(name, i, at=at, limit=1) for i in parts) if p]
            position = min((p[0].position for p in found), default=None)
            if position is None:
                return _browsed([], parts, partition, order, limit, key, None, at_text, None)
        searched_to: int | None = None
        if key is not None:
            if after is not None:
                raise BadRequest("a search by key goes back in time: give before, not after")
            top = before if before is not None else (position + 1 if position is not None else None)
            results = [self.client.search_events(name, i, key, before=top, scan=SEARCH_SCAN, limit=limit)
                       for i in parts]
            events = sorted((e for r in results for e in r.events), key=lambda e: -e.position)[:limit]
            lows = [r.lowest_position for r in results if r.lowest_position is not None]
            searched_to = max(lows) if lows else None
        elif after is not None or position is not None or (order == "oldest" and before is None):
            start = after + 1 if after is not None else (position or 0)
            got = [e for i in parts for e in self.client.read_events(name, i, position=start, limit=limit)]
            events = sorted(got, key=lambda e: e.position)[:limit]
        else:
            top = before if before is not None else _END
            got = [e for i in parts for e in self.client.read_events(name, i, before=top, limit=limit)]
            events = sorted(got, key=lambda e: -e.position)[:limit]
        events.sort(key=lambda e: -e.position if order == "newest" else e.position)
        return _browsed(events, parts, partition, order, limit, key, position, at_text, searched_to)

    def group(self, request: Request) -> Response:
        name = self._group_name(request)
        try:
            rows = self.client.describe_group(name)
        except GroupNotFound:
            rows = []
        try:
            shares = self.client.describe_share_group(name)
        except GroupNotFound:
            shares = []
        if not rows and not shares:
            raise NotFound(f"there is no group named {name!r} (no checkpoints, no share group)")
        members = group_members(self.client, name) if rows else []
        topics = sorted({r.topic for r in rows})
        charts = {t: self.history.lags(name, t) for t in topics}
        share_topics: dict[str, ShareGroupStatus] = {}
        for st in shares:  # the group's settings on each topic (the same on every partition)
            share_topics.setdefault(st.topic, st)
        backlogs = {t: self.history.backlogs(name, t) for t in share_topics}
        return self.page(request, "group.html", group=name, rows=rows, members=members, topics=topics,
                         charts=charts, total_lag=sum(r.lag for r in rows), shares=shares,
                         share_topics=share_topics, backlogs=backlogs,
                         share_totals=_share_totals(shares), now=datetime.now(timezone.utc))

    def dlt(self, request: Request) -> Response:
        name = self._topic(request.path_params["name"])
        desc = self.client.describe_topic(name)
        start = _int(request, "position") or 0
        letters = [e for p in range(desc.topic.partitions)
                   for e in self.client.read_events(name, p, position=start, limit=DLT_PAGE)]
        try:
            progress = self.client.describe_group(_REPLAY_GROUP, name)
        except GroupNotFound:
            progress = []
        replayed = {s.partition: s.checkpoint or 0 for s in progress}
        return self.page(request, "dlt.html", topic=name, desc=desc, letters=letters, replayed=replayed)

    def _dead_letter(self, request: Request) -> tuple[str, Event]:
        name = self._topic(request.path_params["name"])
        partition, position = request.path_params["partition"], request.path_params["position"]
        try:
            found = self.client.read_events(name, partition, position=position, limit=1)
        except InvalidArgument as exc:
            raise BadRequest(str(exc)) from None
        if not found or found[0].position != position:
            raise NotFound(f"{name!r} holds no event at partition {partition}, position {position}")
        return name, found[0]

    def dead_letter(self, request: Request) -> Response:
        name, ev = self._dead_letter(request)
        return self.page(request, "dead_letter.html", topic=name, ev=ev)

    async def replay_one(self, request: Request) -> Response:
        await _check_csrf(request)
        name, ev = await _threaded(self._dead_letter, request)
        res = await _threaded(self.client.replay_dead_letter, name, ev.partition, ev.position)
        what = "was replayed already" if res.duplicate else "replayed"
        msg = f"{what}: {res.topic}[{res.partition}]@{res.position}"
        return RedirectResponse(f"/dlt/{name}/{ev.partition}/{ev.position}?message={_q(msg)}",
                                status_code=303)

    # -- actions behind a confirmation: a GET page that states what will happen, a POST that does it --------
    def _group_name(self, request: Request) -> str:
        name = request.path_params["name"]
        try:
            check_group(name)
        except InvalidName:
            raise NotFound(f"there is no group named {name!r}") from None
        return name

    def _reset_args(self, source: Any) -> tuple[str, str, dict[str, Any]]:
        """The topic, the target in words and ``reset_group``'s keyword arguments from a query or form."""
        topic = self._topic(str(source.get("topic") or ""))
        target = str(source.get("to") or "")
        if target == "earliest":
            return topic, "the oldest retained event", {"to_earliest": True}
        if target == "latest":
            return topic, "after the last committed event", {"to_latest": True}
        if target == "time":
            at = _time(str(source.get("time") or ""))
            return topic, f"the first event at or after {at.isoformat()}", {"to_datetime": at}
        raise BadRequest(f"to must be earliest, latest or time, not {target!r}")

    def confirm_reset(self, request: Request) -> Response:
        group = self._group_name(request)
        topic, what, args = self._reset_args(request.query_params)
        try:
            rows = self.client.reset_group(group, topic, dry_run=True, **args)
        except GroupActive as exc:
            raise Conflict(str(exc)) from None
        return self.page(request, "confirm_reset.html", group=group, topic=topic, what=what, rows=rows,
                         to=request.query_params.get("to"), time=request.query_params.get("time") or "")

    async def reset(self, request: Request) -> Response:
        form = await _check_csrf(request)
        group = await _threaded(self._group_name, request)
        topic, what, args = await _threaded(self._reset_args, form)
        try:
            rows = await _threaded(lambda: self.client.reset_group(group, topic, **args))
        except GroupActive as exc:
            raise Conflict(str(exc)) from None
        moved = sum(r.previous != r.checkpoint for r in rows)
        msg = f"reset {group} on {topic} to {what}: {moved} of {len(rows)} partition(s) moved"
        return RedirectResponse(f"/groups/{group}?message={_q(msg)}", status_code=303)

    def confirm_delete(self, request: Request) -> Response:
        group = self._group_name(request)
        try:
            rows = self.client.describe_group(group)
        except GroupNotFound:
            raise NotFound(f"there is no group named {group!r} (no checkpoints)") from None
        return self.page(request, "confirm_delete.html", group=group, rows=rows,
                         topics=sorted({r.topic for r in rows}))

    async def delete(self, request: Request) -> Response:
        await _check_csrf(request)
        group = await _threaded(self._group_name, request)
        try:
            n = await _threaded(self.client.delete_group, group)
        except GroupNotFound:
            raise NotFound(f"there is no group named {group!r} (no checkpoints)") from None
        except GroupActive as exc:
            raise Conflict(str(exc)) from None
        msg = f"deleted group {group}: {n} checkpoint(s), its leases and its configuration"
        return RedirectResponse(f"/?message={_q(msg)}", status_code=303)

    def confirm_replay_all(self, request: Request) -> Response:
        name = self._topic(request.path_params["name"])
        plan = self.client.replay_dead_letters(name, dry_run=True)
        targets = sorted({e.headers.get("dlt.topic", "?") for e in plan.events})
        return self.page(request, "confirm_replay.html", topic=name, plan=plan, targets=targets)

    async def replay_all(self, request: Request) -> Response:
        await _check_csrf(request)
        name = await _threaded(self._topic, request.path_params["name"])
        res = await _threaded(self.client.replay_dead_letters, name)
        msg = f"replayed {res.replayed} dead letter(s) of {res.read} read ({res.skipped} passed over)"
        return RedirectResponse(f"/dlt/{name}?message={_q(msg)}", status_code=303)


def _group_rows(lags: Iterable[GroupLag]) -> dict[str, dict[str, Any]]:
    """Per stream group of the status: its topics, total lag, the partition states that need a look
    (blocked, retrying, stale) and its state (:data:`pgstreams.GROUP_STATES`; one word when it is the same
    on every topic)."""
    by_group: dict[str, dict[str, list[GroupLag]]] = {}
    for g in lags:
        by_group.setdefault(g.group, {}).setdefault(g.topic, []).append(g)
    rows: dict[str, dict[str, Any]] = {}
    for group, topics in by_group.items():
        parts = [g for on_topic in topics.values() for g in on_topic]
        rows[group] = {"topics": set(topics), "lag": sum(g.lag for g in parts),
                       "problems": {g.state for g in parts} & {"blocked", "retrying", "stale"},
                       "state": " / ".join(sorted({group_state(t) for t in topics.values()}))}
    return rows


#: How many events of each partition a search by key walks back through (see Client.search_events).
SEARCH_SCAN = 10_000
#: A position past every event: the end of a partition for a read before it.
_END = 1 << 62


def _browsed(events: list[Event], parts: list[int], partition: int | None, order: str, limit: int,
             key: str | None, position: int | None, time: str | None, searched_to: int | None
             ) -> dict[str, Any]:
    """The event browser's template context: the events, the query, and the positions of the pages
    before and after (``older``: events below the lowest shown; ``newer``: above the highest)."""
    positions = [e.position for e in events]
    return {"events": events, "partition": partition, "order": order, "limit": limit, "key": key or "",
            "position": position, "time": time or "", "scan": SEARCH_SCAN, "searched_to": searched_to,
            "older": min(positions) if positions else None, "newer": max(positions) if positions else None,
            "all_partitions": len(parts) > 1}


def _share_totals(shares: list[ShareGroupStatus] | tuple[ShareGroupStatus, ...]) -> dict[str, Any]:
    """The sums over some partitions of a share group: events in flight, available, waiting, delivered
    too often; the counters; the oldest lock."""
    locks = [s.oldest_lock for s in shares if s.oldest_lock is not None]
    return {"acquired": sum(s.acquired for s in shares), "available": sum(s.available for s in shares),
            "waiting": sum(s.waiting for s in shares),
            "delivered_too_often": sum(s.delivered_too_often for s in shares),
            "rejected": sum(s.rejected for s in shares),
            "dead_lettered": sum(s.dead_lettered for s in shares),
            "removed_too_often": sum(s.removed_too_often for s in shares),
            "lost_events": sum(s.lost_events for s in shares), "oldest_lock": min(locks, default=None),
            "topics": sorted({s.topic for s in shares}), "partitions": len(shares),
            "queue": any(s.queue for s in shares)}


def _share_groups(shares: tuple[ShareGroupStatus, ...]) -> dict[str, dict[str, Any]]:
    """The share groups of a status snapshot, each with its totals (see :func:`_share_totals`)."""
    by_group: dict[str, list[ShareGroupStatus]] = {}
    for s in shares:
        by_group.setdefault(s.group, []).append(s)
    return {g: _share_totals(rows) for g, rows in sorted(by_group.items())}


def _q(text: str) -> str:
    return quote(text, safe="")


async def _threaded(fn: Any, *args: Any) -> Any:
    return await run_in_threadpool(fn, *args)


def create_app(client: Client, *, credentials: Credentials | None = None, refresh: float = DEFAULT_REFRESH,
               history_minutes: float = DEFAULT_HISTORY_MINUTES) -> Starlette:
    """The console as an ASGI application over ``client`` (serve it with any ASGI server; ``pgstreams
    console`` uses uvicorn). ``credentials`` (default none: no authentication) are required of every
    request; ``refresh`` (default :data:`DEFAULT_REFRESH` s) is how often pages update themselves and
    the charts take a sample; they show the last ``history_minutes`` (default
    :data:`DEFAULT_HISTORY_MINUTES`)."""
    if isinstance(refresh, bool) or not isinstance(refresh, int | float) or refresh <= 0:
        raise InvalidArgument(f"refresh must be a positive number of seconds, not {refresh!r}")
    history = History(client.status, float(refresh), history_minutes)
    console = Console(client, history, float(refresh))

    async def error_page(request: Request, exc: Exception) -> Response:
        code = exc.status_code if isinstance(exc, HTTPException) else 500
        detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
        if isinstance(exc, PgStreamsError):
            code, detail = 400, str(exc)
        return console.page(request, "error.html", status_code=code, code=code, detail=detail)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        history.start()
        try:
            yield
        finally:
            history.stop()

    routes = [
        Route("/", console.overview, name="overview"),
        Route("/topics/{name}", console.topic, name="topic"),
        Route("/groups/{name}", console.group, name="group"),
        Route("/groups/{name}/reset", console.confirm_reset, name="confirm_reset"),
        Route("/groups/{name}/reset", console.reset, methods=["POST"], name="reset"),
        Route("/groups/{name}/delete", console.confirm_delete, name="confirm_delete"),
        Route("/groups/{name}/delete", console.delete, methods=["POST"], name="delete"),
        Route("/dlt/{name}/replay", console.confirm_replay_all, name="confirm_replay_all"),
        Route("/dlt/{name}", console.dlt, name="dlt"),
        Route("/dlt/{name}/replay", console.replay_all, methods=["POST"], name="replay_all"),
        Route("/dlt/{name}/{partition:int}/{position:int}", console.dead_letter, name="dead_letter"),
        Route("/dlt/{name}/{partition:int}/{position:int}/replay", console.replay_one, methods=["POST"],
              name="replay_one"),
        Mount("/static", StaticFiles(directory=str(_HERE / "static")), name="static"),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(_Auth)], lifespan=lifespan,
                    exception_handlers={HTTPException: error_page, PgStreamsError: error_page})
    app.state.credentials = credentials or Credentials()
    app.state.csrf = secrets.token_urlsafe(32)
    app.state.console = console
    return app
