"""A PySpark worker daemon that imports what pgstreams' Python workers need once, before it forks them.

PySpark starts one daemon per kind of Python worker and forks a worker from it for each task that finds
no idle one; every forked worker then imports PySpark's worker code, and the first task that reads or
writes a topic imports pgstreams and psycopg: about 0.3 s of CPU per worker, paid again by every micro-batch
that needs a new worker. With this daemon those modules are imported once, in the daemon, and each worker
starts with them loaded::

    SparkSession.builder.config("spark.python.daemon.module", "pgstreams.spark_daemon")

(a setting of the Spark context: give it when the session is built; ``pgstreams demo`` sets it). It
changes nothing else: the daemon is PySpark's own (:func:`pyspark.daemon.manager`). Only modules that start
no thread when imported are loaded before the fork (a fork copies no thread but the one calling it, and a
lock another thread held would stay locked in the child): Arrow (which starts threads on import) is still
imported by each worker.
"""

from __future__ import annotations

import importlib
import os
import sys

#: The modules the daemon imports before it forks workers: none of them starts a thread.
PRELOADED = ("psycopg", "psycopg_pool", "pgstreams", "pyspark.worker")


def threads() -> int:
    """How many threads this process runs (native ones included, which :mod:`threading` does not see)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # no /proc: only Python's own threads are known
        import threading

        return threading.active_count()


def preload(modules: tuple[str, ...] = PRELOADED) -> bool:
    """Import ``modules`` (default :data:`PRELOADED`, those missing skipped); return whether this process
    still runs a single thread."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
    return threads() == 1


def main() -> None:
    """Preload, then run PySpark's daemon with this module's arguments (the worker module to run). Should
    a preloaded module have started a thread, PySpark's daemon is run instead, in place of this process
    (``exec``: no thread survives it), and imports nothing before it forks."""
    if not preload(PRELOADED):
        os.execv(sys.executable, [sys.executable, "-m", "pyspark.daemon", *sys.argv[1:]])
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()
