"""The options of ``pgstreams demo`` (:class:`DemoOptions`), their defaults, and the demo's error."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pgstreams.errors import InvalidArgument, PgStreamsError

from .._util import interval_seconds
from ..serving import BACKGROUND_NICE, resolve_mode


class DemoError(PgStreamsError):
    """The demo could not complete (a stage did not finish within the time limit, a worker died, ...)."""


#: The clean query's default trigger: the next micro-batch starts as soon as the previous one ended (the
#: clean query is on the serving path: impression -> clean -> prediction; see docs/ml-system.md).
CLEAN_TRIGGER = "0 seconds"
#: The Spark scheduler pool of the clean query (the session schedules pools fairly, so the clean query's
#: short jobs do not queue behind the join's, the monitor's and training's).
SERVING_POOL = "serving"


@dataclass(frozen=True)
class DemoOptions:
    """Options of :func:`run_demo` (the ``pgstreams demo`` options).

    ``dsn`` (default ``None``: ``$PGSTREAMS_DSN``, else the embedded server); ``reports`` folder (default
    ``reports``); ``seed`` (7); simulated ``duration`` (4 h), impression ``rate`` per simulated second (4),
    ``speed`` (simulated seconds per wall second, 240); ``drift`` (true: at half time); ``users`` (2000),
    ``ads`` (200); topic ``partitions`` (2, also Spark's shuffle partitions); ``scorers`` (1 worker);
    monitoring ``window`` (``None``: a sixteenth of the duration); Spark ``trigger`` interval of the join
    and monitor queries (``2 seconds``) and ``clean_trigger`` of the clean query, the one that feeds
    scoring (:data:`CLEAN_TRIGGER`), ``master`` (``local[2]``) and ``max_events_per_trigger`` (20000);
    ``checkpoints``, where the queries keep their checkpoints (``None``: a temporary folder of the driver;
    on a cluster of several machines a location every executor reaches, such as ``hdfs://...``);
    ``serving``: where the serving path (clean query, scorers) runs (:data:`serving.SERVING_MODES`; default
    ``auto``: in processes of its own with a local master, in the demo's Spark session otherwise);
    ``background_nice``: with the serving path in processes of its own, how much the demo lowers the CPU
    priority of its other parts (:data:`serving.BACKGROUND_NICE`, 10; 0 leaves it alone);
    ``timeout`` for the whole run (900 s); ``progress`` bars (true).
    """

    dsn: str | None = None
    reports: Path = Path("reports")
    seed: int = 7
    duration: float = 4 * 3600.0
    rate: float = 4.0
    speed: float = 240.0
    drift: bool = True
    users: int = 2000
    ads: int = 200
    partitions: int = 2
    scorers: int = 1
    window: str | None = None
    trigger: str = "2 seconds"
    clean_trigger: str = CLEAN_TRIGGER
    master: str | None = None
    checkpoints: str | None = None
    max_events_per_trigger: int = 20000
    serving: str = "auto"
    background_nice: int = BACKGROUND_NICE
    timeout: float = 900.0
    progress: bool = True

    def __post_init__(self) -> None:
        if self.duration < 1800:
            raise InvalidArgument(
                f"duration must be at least 30 minutes of simulated time, got {self.duration}s"
            )
        if not isinstance(self.scorers, int) or self.scorers < 1:
            raise InvalidArgument(f"scorers must be a positive integer, got {self.scorers!r}")
        if self.timeout <= 0:
            raise InvalidArgument(f"timeout must be positive, got {self.timeout!r}")
        try:
            resolve_mode(self.serving, self.master)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        if not 0 <= self.background_nice <= 19:
            raise InvalidArgument(f"background_nice must be between 0 and 19, got {self.background_nice!r}")

    @property
    def serving_mode(self) -> str:
        """``processes`` or ``session`` (``serving`` resolved for ``master``)."""
        return resolve_mode(self.serving, self.master)

    @property
    def window_seconds(self) -> int:
        """The monitoring window in seconds."""
        if self.window:
            return int(interval_seconds(self.window))
        return max(60, int(self.duration / 16))
