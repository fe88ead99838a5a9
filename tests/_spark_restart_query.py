"""The streaming copy query (``_spark_helpers.copy_query``, ``availableNow``) that
``tests/spark/test_spark_restarts.py`` runs while it restarts PostgreSQL.

Run as a script (``python _spark_restart_query.py DSN CHECKPOINT MARKERS MASTER``): in a SparkSession of its
own on master ``MASTER``, the tasks of micro-batch 0 wait on their first row until ``MARKERS/locked`` exists
(the test has set its trap for micro-batch 1 by then); every task attempt after the first creates
``MARKERS/retried-<batch>-<partition>-<attempt>``. A query that fails is started again from its checkpoint,
up to 5 times (a start that fails because the server is not back yet is tried again a second later).
Prints the number of runs as JSON and exits 0 once a run finished without error.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from _spark_helpers import copy_query, session


def stall_once(markers: str) -> object:
    """The ``stall`` function of :func:`_spark_helpers.copy_query` described above."""

    def stall(batch: int, partition: int) -> None:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        attempt = ctx.attemptNumber() if ctx is not None else 0
        root = Path(markers)
        if attempt > 0:
            (root / f"retried-{batch}-{partition}-{attempt}").touch()
        if batch == 0:
            deadline = time.monotonic() + 600
            while not (root / "locked").exists() and time.monotonic() < deadline:
                time.sleep(0.05)

    return stall


def main(argv: list[str]) -> int:
    from pyspark.errors import AnalysisException, StreamingQueryException

    dsn, checkpoint, markers, master = argv
    spark = session("pgstreams-restarted-server", master=master)
    runs = starts = 0
    while runs < 5 and starts < 120:
        starts += 1
        try:
            query = copy_query(spark, dsn, checkpoint, stall_once(markers)).trigger(availableNow=True).start()
        except AnalysisException as exc:  # the server is not back yet: start again a little later
            print(f"start {starts} failed: {str(exc)[:300]}", file=sys.stderr, flush=True)
            time.sleep(1.0)
            continue
        runs += 1
        try:
            query.awaitTermination()
        except StreamingQueryException as exc:
            print(f"run {runs} failed: {str(exc)[:300]}", file=sys.stderr, flush=True)
            continue
        print(json.dumps({"runs": runs}), flush=True)
        return 0
    return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
