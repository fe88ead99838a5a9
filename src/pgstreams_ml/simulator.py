"""The event simulator: users see ads, some click, a few convert; profiles and the catalogue change.

Everything is drawn from one seeded random generator, so a seed gives the same events every run. Time is
simulated: events carry simulated timestamps starting at :attr:`SimConfig.start`; ``speed`` simulated
seconds pass per wall-clock second (``0``: as fast as possible).

Outputs:

- the raw topic (``ml.raw``): impressions, clicks and conversions as JSON *text* the way a sloppy producer
  sends them: 70% of timestamps on a Chicago clock with its offset (``-06:00``/``-05:00``; the default start
  crosses the March daylight-saving change), the rest in UTC; events published late and out of order;
  duplicates (the same event re-sent); malformed records (bad JSON, unknown types, missing or invalid
  fields, timestamps without a zone, unparseable timestamps). Every record carries a ``seq`` header.
- the updates topic (``ml.updates``): user profile and ad catalogue versions (the first ones before any
  impression), which the enrichment group folds into the enrichment store.
- hidden tables the pipelines never read: ``oracle`` (each impression's true click probability and regime)
  and ``sim_ledger`` (each raw record's ``seq`` with the verdict a correct cleaner must reach), used to
  measure the oracle's AUC and to reconcile the clean pipeline's counts.
"""

from __future__ import annotations

import heapq
import json
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import pgstreams
from pgstreams.errors import InvalidArgument

from . import _sql, events
from .config import Topology
from .domain import CATEGORIES, COUNTRIES, DEVICES, REGIMES, SLOTS

#: Default simulated start: midnight in Chicago on the day clocks move forward (2025-03-09 06:00 UTC).
DEFAULT_START = datetime(2025, 3, 9, 6, 0, tzinfo=timezone.utc)


@dataclass(frozen=True)
class SimConfig:
    """Simulator settings (simulated seconds unless said otherwise).

    ``rate`` impressions per simulated second (default 4); ``duration`` simulated seconds (default 4 h);
    ``speed`` simulated seconds per wall second (default 0 = as fast as possible); ``drift_at`` seconds after
    ``start`` at which the ground truth switches to regime 1 (default ``None``: never). Dirt:
    ``malformed_rate`` (0.01) of events are sent corrupted instead, ``duplicate_rate`` (0.02) are sent twice,
    ``late_rate`` (0.03) are published up to ``max_lateness`` (120 s) late, ``chicago_share`` (0.7) carry a
    Chicago-clock timestamp. ``user_update_rate`` (0.5/s) and ``ad_update_rate`` (0.05/s) profile and
    catalogue changes; clicks follow impressions after an exponential delay (mean ``click_delay_mean``
    20 s, at most ``click_delay_max`` 240 s); ``conversion_rate`` (0.1) of clicks convert. Events are
    published in batches covering ``tick`` (30 s) of simulated time.
    """

    seed: int = 7
    users: int = 2000
    ads: int = 200
    rate: float = 4.0
    duration: float = 4 * 3600.0
    speed: float = 0.0
    start: datetime = DEFAULT_START
    drift_at: float | None = None
    malformed_rate: float = 0.01
    duplicate_rate: float = 0.02
    late_rate: float = 0.03
    max_lateness: float = 120.0
    chicago_share: float = 0.7
    user_update_rate: float = 0.5
    ad_update_rate: float = 0.05
    click_delay_mean: float = 20.0
    click_delay_max: float = 240.0
    conversion_rate: float = 0.1
    tick: float = 30.0

    def __post_init__(self) -> None:
        def check(name: str, ok: bool, want: str) -> None:
            if not ok:
                raise InvalidArgument(f"{name} must be {want}, got {getattr(self, name)!r}")

        def num(name: str) -> float:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
                raise InvalidArgument(f"{name} must be a number, got {v!r}")
            return float(v)

        check("seed", isinstance(self.seed, int) and not isinstance(self.seed, bool), "an integer")
        for n in ("users", "ads"):
            v = getattr(self, n)
            check(n, isinstance(v, int) and not isinstance(v, bool) and v >= 1, "a positive integer")
        check("rate", num("rate") > 0, "> 0")
        check("duration", num("duration") > 0, "> 0")
        check("speed", num("speed") >= 0, ">= 0 (0 = as fast as possible)")
        check("tick", num("tick") > 0, "> 0")
        for n in ("malformed_rate", "duplicate_rate", "late_rate", "chicago_share", "conversion_rate"):
            check(n, 0.0 <= num(n) <= 1.0, "between 0 and 1")
        for n in ("max_lateness", "user_update_rate", "ad_update_rate"):
            check(n, num(n) >= 0, ">= 0")
        check("click_delay_mean", num("click_delay_mean") > 0, "> 0")
        check("click_delay_max", num("click_delay_max") > 0, "> 0")
        check(
            "start",
            isinstance(self.start, datetime) and self.start.utcoffset() is not None,
            "an aware datetime",
        )
        if self.drift_at is not None:
            check("drift_at", 0 <= num("drift_at") <= self.duration, "between 0 and duration")

    @property
    def end(self) -> datetime:
        """The simulated end time."""
        return self.start + timedelta(seconds=self.duration)

    @property
    def drift_time(self) -> datetime | None:
        """The simulated time of the drift switch, if any."""
        return None if self.drift_at is None else self.start + timedelta(seconds=self.drift_at)


@dataclass
class SimStats:
    """Counters of a run, updated as it goes (read them from another thread for progress)."""

    sim_seconds: float = 0.0
    impressions: int = 0
    clicks: int = 0
    conversions: int = 0
    raw_records: int = 0
    updates: int = 0
    malformed: int = 0
    duplicates: int = 0
    late: int = 0
    by_reason: Counter[str] = field(default_factory=Counter)
    paused: bool = False
    done: bool = False


@dataclass(order=True)
class _Pending:
    publish_at: int  # ms since start
    order: int
    event: dict[str, Any] = field(compare=False)
    duplicate: bool = field(default=False, compare=False)


_MISSPELLED = {"impression": "impresion", "click": "clik", "conversion": "convertion"}
_INVALID_FIELD = {"impression": ("slot", "device"), "conversion": ("value",)}


class Simulator:
    """Generates the event streams of :class:`SimConfig` into the topics and tables of a :class:`Topology`.

    Call :meth:`run` (blocking; from a thread for background use). ``gates`` are ``(seconds after start,
    threading.Event)`` pairs: simulated time does not pass a gate's moment before its event is set.
    ``on_tick`` is called after each published batch. Event ids are prefixed with the run number
    (``r1-imp-00000001``) and ``seq`` numbers continue the ledger, so several runs can feed the same topics.
    """

    def __init__(
        self, client: pgstreams.Client, config: SimConfig | None = None, topology: Topology | None = None
    ) -> None:
        self.client = client
        self.config = config or SimConfig()
        self.topo = topology or Topology()
        self.stats = SimStats()
        self.stop_event = threading.Event()
        self.run_id: int | None = None
        self._prefix = ""
        cfg = self.config
        self._rng = random.Random(cfg.seed)
        self._seq = 0
        self._order = 0
        self._pending: list[_Pending] = []
        self._users: dict[str, dict[str, Any]] = {}
        self._ads: dict[str, dict[str, Any]] = {}
        self._ads_by_cat: dict[str, list[str]] = {c: [] for c in CATEGORIES}
        self._n_imp = self._n_clk = self._n_cnv = self._n_upd = 0
        self._make_world()

    # -- world -------------------------------------------------------------------------------------------
    def _make_world(self) -> None:
        rng = self._rng
        for i in range(self.config.users):
            uid = f"u{i:05d}"
            self._users[uid] = {
                "age": rng.randint(18, 70),
                "country": rng.choices(COUNTRIES, (0.5, 0.15, 0.1, 0.15, 0.1))[0],
                "fav_category": rng.choice(CATEGORIES),
                "activity": round(rng.betavariate(2, 2), 4),
            }
        for i in range(self.config.ads):
            aid = f"a{i:04d}"
            cat = CATEGORIES[i % len(CATEGORIES)] if i < len(CATEGORIES) else rng.choice(CATEGORIES)
            self._ads[aid] = {
                "advertiser": f"adv{rng.randrange(max(1, self.config.ads // 5)):03d}",
                "category": cat,
                "price": round(math.exp(rng.gauss(math.log(40.0), 0.9)), 2),
                "quality": round(rng.betavariate(2, 2), 4),
            }
            self._ads_by_cat[cat].append(aid)

    def _ts(self, ms: int) -> datetime:
        return self.config.start + timedelta(milliseconds=ms)

    def _style(self) -> str:
        return "chicago" if self._rng.random() < self.config.chicago_share else "utc"

    # -- events ------------------------------------------------------------------------------------------
    def _user_event(self, uid: str, ms: int) -> dict[str, Any]:
        self._n_upd += 1
        return {
            "event_id": f"{self._prefix}usr-{self._n_upd:08d}",
            "type": "user_profile",
            "ts_ms": ms,
            "user_id": uid,
            **self._users[uid],
        }

    def _ad_event(self, aid: str, ms: int) -> dict[str, Any]:
        self._n_upd += 1
        return {
            "event_id": f"{self._prefix}adv-{self._n_upd:08d}",
            "type": "ad_catalogue",
            "ts_ms": ms,
            "ad_id": aid,
            **self._ads[aid],
        }

    def _schedule(self, ev: dict[str, Any], duplicate: bool = False, delay_ms: int = 0) -> None:
        cfg, rng = self.config, self._rng
        at = int(ev["ts_ms"]) + delay_ms
        if not duplicate and rng.random() < cfg.late_rate:
            at += int(rng.uniform(0.2, 1.0) * cfg.max_lateness * 1000)
            self.stats.late += 1
        self._order += 1
        heapq.heappush(self._pending, _Pending(at, self._order, ev, duplicate))

    def _impression(self, ms: int, regime_no: int, oracle: list[tuple]) -> None:
        cfg, rng = self.config, self._rng
        regime = REGIMES[regime_no]
        uid = f"u{rng.randrange(cfg.users):05d}"
        cat = rng.choices(CATEGORIES, regime.category_mix)[0]
        pool = self._ads_by_cat[cat] or list(self._ads)
        aid = rng.choice(pool)
        device = rng.choices(DEVICES, regime.device_mix)[0]
        slot = rng.choice(SLOTS)
        row = {**self._users[uid], **self._ads[aid], "device": device, "slot": slot}
        p = regime.probability(row)
        clicked = rng.random() < p
        self._n_imp += 1
        iid = f"{self._prefix}imp-{self._n_imp:08d}"
        self.stats.impressions += 1
        oracle.append((iid, self._ts(ms), regime_no, p, clicked))
        self._schedule(
            {
                "event_id": iid,
                "type": "impression",
                "ts_ms": ms,
                "user_id": uid,
                "ad_id": aid,
                "slot": slot,
                "device": device,
            }
        )
        if clicked:
            self._n_clk += 1
            self.stats.clicks += 1
            delay = min(rng.expovariate(1.0 / cfg.click_delay_mean), cfg.click_delay_max)
            cms = ms + max(1, int(delay * 1000))
            self._schedule(
                {
                    "event_id": f"{self._prefix}clk-{self._n_clk:08d}",
                    "type": "click",
                    "ts_ms": cms,
                    "impression_id": iid,
                    "user_id": uid,
                    "ad_id": aid,
                }
            )
            if rng.random() < cfg.conversion_rate:
                self._n_cnv += 1
                self.stats.conversions += 1
                vms = cms + max(1, int(rng.expovariate(1 / 60.0) * 1000))
                self._schedule(
                    {
                        "event_id": f"{self._prefix}cnv-{self._n_cnv:08d}",
                        "type": "conversion",
                        "ts_ms": vms,
                        "impression_id": iid,
                        "user_id": uid,
                        "value": round(rng.uniform(5, 200), 2),
                    }
                )

    def _update_user(self, ms: int) -> dict[str, Any]:
        rng = self._rng
        uid = f"u{rng.randrange(self.config.users):05d}"
        u = self._users[uid]
        u["activity"] = round(min(1.0, max(0.0, u["activity"] + rng.gauss(0, 0.15))), 4)
        if rng.random() < 0.1:
            u["fav_category"] = rng.choice(CATEGORIES)
        return self._user_event(uid, ms)

    def _update_ad(self, ms: int) -> dict[str, Any]:
        rng = self._rng
        aid = f"a{rng.randrange(self.config.ads):04d}"
        a = self._ads[aid]
        a["price"] = round(max(1.0, a["price"] * math.exp(rng.gauss(0, 0.2))), 2)
        a["quality"] = round(min(1.0, max(0.0, a["quality"] + rng.gauss(0, 0.1))), 4)
        return self._ad_event(aid, ms)

    # -- serialisation -----------------------------------------------------------------------------------
    def _payload(self, ev: dict[str, Any], ts_style: str) -> dict[str, Any]:
        out = {k: v for k, v in ev.items() if k != "ts_ms"}
        out["ts"] = events.format_ts(self._ts(int(ev["ts_ms"])), ts_style)
        return out

    def _corrupt(self, ev: dict[str, Any]) -> tuple[str, str]:
        """A corrupted rendering of ``ev`` and the reason a cleaner must give."""
        rng = self._rng
        etype = ev["type"]
        choices = [
            events.INVALID_JSON,
            events.UNKNOWN_EVENT_TYPE,
            events.MISSING_FIELD,
            events.TIMESTAMP_WITHOUT_ZONE,
            events.INVALID_TIMESTAMP,
        ]
        if etype in _INVALID_FIELD:
            choices.append(events.INVALID_FIELD)
        reason = rng.choice(choices)
        body = self._payload(ev, self._style())
        if reason == events.INVALID_JSON:
            text = json.dumps(body)
            return text[: max(1, len(text) // 2)], reason
        if reason == events.UNKNOWN_EVENT_TYPE:
            body["type"] = _MISSPELLED[etype]
        elif reason == events.MISSING_FIELD:
            del body[rng.choice([f for f in events.REQUIRED[etype] if f != "ts"])]
        elif reason == events.INVALID_FIELD:
            name = rng.choice(_INVALID_FIELD[etype])
            body[name] = {
                "slot": rng.choice(["two", 0, 7]),
                "device": "smartwatch",
                "value": rng.choice(["abc", -4.5]),
            }[name]
        elif reason == events.TIMESTAMP_WITHOUT_ZONE:
            body["ts"] = events.format_ts(self._ts(int(ev["ts_ms"])), "naive_chicago")
        else:
            local = self._ts(int(ev["ts_ms"])) + events.chicago_offset(self._ts(int(ev["ts_ms"])))
            body["ts"] = rng.choice(
                [
                    local.strftime("%m/%d/%Y %I:%M:%S %p"),
                    "yesterday",
                    str(int(self._ts(int(ev["ts_ms"])).timestamp())),
                ]
            )
        return json.dumps(body), reason

    # -- publishing --------------------------------------------------------------------------------------
    def _publish(self, due: list[_Pending], updates: list[dict[str, Any]], oracle: list[tuple]) -> None:
        cfg, rng = self.config, self._rng
        rng.shuffle(due)  # out of order within a batch too
        raw: list[pgstreams.Message] = []
        ledger: list[tuple] = []
        for item in due:
            ev = item.event
            self._seq += 1
            seq = self._seq
            key = ev.get("user_id")
            if item.duplicate:
                text, verdict, reason = item.event["_text"], "duplicate", None
                self.stats.duplicates += 1
            elif rng.random() < cfg.malformed_rate:
                text, reason = self._corrupt(ev)
                verdict = "malformed"
                self.stats.malformed += 1
                self.stats.by_reason[reason] += 1
            else:
                text, verdict, reason = json.dumps(self._payload(ev, self._style())), "clean", None
                if rng.random() < cfg.duplicate_rate:
                    copy = dict(ev)
                    copy["_text"] = text
                    self._schedule(
                        copy,
                        duplicate=True,
                        delay_ms=item.publish_at - int(ev["ts_ms"]) + rng.randrange(1, 30_000),
                    )
            raw.append(pgstreams.Message(value=text, key=key, headers={"seq": str(seq), "producer": "sim"}))
            ledger.append((seq, ev["event_id"], ev["type"], verdict, reason, self._ts(int(ev["ts_ms"]))))
        upd = [
            pgstreams.Message(
                value=json.dumps(self._payload(u, self._style())),
                key=u.get("user_id") or u.get("ad_id"),
                event_type=u["type"],
                event_id=u["event_id"],
            )
            for u in updates
        ]
        schema = self.topo.schema
        with self.client.connection() as conn, conn.transaction():
            cur = conn.cursor()
            if oracle:
                with cur.copy(_sql.q("copy_oracle", schema)) as cp:
                    for r in oracle:
                        cp.write_row(r)
            if ledger:
                with cur.copy(_sql.q("copy_ledger", schema)) as cp:
                    for r in ledger:
                        cp.write_row(r)
        # updates first: a profile version is in the store's topic before the impressions that use it
        if upd:
            self.client.publish_many(self.topo.updates_topic, upd)
            self.stats.updates += len(upd)
        if raw:
            self.client.publish_many(self.topo.raw_topic, raw)
            self.stats.raw_records += len(raw)

    # -- running -----------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask :meth:`run` to stop after the batch in hand."""
        self.stop_event.set()

    def _start_run(self) -> None:
        cfg = self.config
        params = {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in asdict(cfg).items()}
        with self.client.connection() as conn:
            row = conn.execute(
                _sql.q("insert_sim_run", self.topo.schema),
                (cfg.seed, json.dumps(params), cfg.start, cfg.end, cfg.drift_time),
            ).fetchone()
        assert row is not None
        self.run_id = int(row[0])
        # ids and sequence numbers continue across runs into the same tables and topics
        self._prefix = f"r{self.run_id}-"
        with self.client.connection() as conn:
            last = conn.execute(_sql.q("last_ledger_seq", self.topo.schema)).fetchone()
        self._seq = int(last[0]) if last and last[0] is not None else 0

    def _finish_run(self) -> None:
        s = self.stats
        counts = {
            "impressions": s.impressions,
            "clicks": s.clicks,
            "conversions": s.conversions,
            "raw_records": s.raw_records,
            "updates": s.updates,
            "malformed": s.malformed,
            "duplicates": s.duplicates,
            "late": s.late,
            "by_reason": dict(s.by_reason),
        }
        with self.client.connection() as conn:
            conn.execute(_sql.q("finish_sim_run", self.topo.schema), (json.dumps(counts), self.run_id))

    def run(
        self,
        gates: Sequence[tuple[float, threading.Event]] = (),
        on_tick: Callable[[SimStats], None] | None = None,
        throttle: Callable[[float], bool] | None = None,
    ) -> SimStats:
        """Generate and publish everything; return the final :class:`SimStats`.

        ``throttle(seconds_since_start)``, when given, is asked before each batch; while it returns false
        simulated time stands still (the demo uses it to keep the simulator at most a little ahead of the
        pipelines on a slow machine).

        Stops early when :meth:`stop` is called (events generated so far are published). Events scheduled
        after the end (late clicks, delayed duplicates) are published at the end.
        """
        cfg, rng = self.config, self._rng
        self._start_run()
        # the initial profiles and catalogue, a minute before the first impression
        first = [self._user_event(u, -60_000) for u in self._users] + [
            self._ad_event(a, -60_000) for a in self._ads
        ]
        self._publish([], first, [])
        gates_left = sorted(gates, key=lambda g: g[0])
        wall0, sim0 = time.monotonic(), 0.0
        tick_ms = int(cfg.tick * 1000)
        end_ms = int(cfg.duration * 1000)
        t = 0
        while t < end_ms and not self.stop_event.is_set():
            while gates_left and gates_left[0][0] * 1000 <= t:
                gate = gates_left.pop(0)[1]
                if not gate.is_set():
                    self.stats.paused = True
                    while not gate.wait(0.2):
                        if self.stop_event.is_set():
                            break
                    self.stats.paused = False
                    wall0, sim0 = time.monotonic(), t / 1000.0
            if throttle is not None and not throttle(t / 1000.0):
                self.stats.paused = True
                while not throttle(t / 1000.0) and not self.stop_event.wait(0.2):
                    pass
                self.stats.paused = False
                wall0, sim0 = time.monotonic(), t / 1000.0
            hi = min(t + tick_ms, end_ms)
            items: list[tuple[int, int]] = []  # (ms, kind) with kind 0 user update, 1 ad update, 2 impression
            span = (hi - t) / 1000.0
            for kind, rate in ((0, cfg.user_update_rate), (1, cfg.ad_update_rate), (2, cfg.rate)):
                n = _poisson(rng, rate * span)
                items.extend((rng.randrange(t, hi), kind) for _ in range(n))
            items.sort()
            updates: list[dict[str, Any]] = []
            oracle: list[tuple] = []
            for ms, kind in items:
                if kind == 0:
                    updates.append(self._update_user(ms))
                elif kind == 1:
                    updates.append(self._update_ad(ms))
                else:
                    regime = 1 if cfg.drift_at is not None and ms >= cfg.drift_at * 1000 else 0
                    self._impression(ms, regime, oracle)
            due = []
            while self._pending and self._pending[0].publish_at < hi:
                due.append(heapq.heappop(self._pending))
            self._publish(due, updates, oracle)
            t = hi
            self.stats.sim_seconds = t / 1000.0
            if on_tick:
                on_tick(self.stats)
            if cfg.speed > 0:
                ahead = (t / 1000.0 - sim0) / cfg.speed - (time.monotonic() - wall0)
                if ahead > 0:
                    self.stop_event.wait(ahead)  # rate control of the producer, not synchronisation
        rest = []
        while self._pending:
            rest.append(heapq.heappop(self._pending))
        while rest:
            self._publish(rest, [], [])
            rest = []
            while self._pending:  # duplicates scheduled by the flush itself
                rest.append(heapq.heappop(self._pending))
        self._finish_run()
        self.stats.done = True
        if on_tick:
            on_tick(self.stats)
        return self.stats


def _poisson(rng: random.Random, lam: float) -> int:
    if lam <= 0:
        return 0
    if lam > 50:
        return max(0, round(rng.gauss(lam, math.sqrt(lam))))
    limit, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1
