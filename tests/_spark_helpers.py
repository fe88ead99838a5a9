"""Spark settings shared by the Spark tests, and the streaming copy query that
``test_spark.test_query_killed_mid_batch_restarts_without_loss_or_duplicate`` kills and restarts.

Run as a script (``python _spark_helpers.py DSN CHECKPOINT``), it starts that query in a SparkSession of
its own with a stall in micro-batch 1 and waits for it forever: the test kills the whole process.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

#: The options of every JVM the tests start (set in ``$JAVA_TOOL_OPTIONS`` by ``conftest.py``, so that the
#: drivers of subprocesses, Spark's standalone daemons and executors get them too): the client compiler
#: only and the serial collector. The tests' JVMs live a few seconds to a few minutes with small jobs: the
#: optimising compiler's threads and the parallel collector's cost more CPU than they save.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

#: Settings of every SparkSession of the tests: no UI, two shuffle partitions and default parallelism
#: (``local[2]``), no empty micro-batches, Python workers reused, UTC session time zone, and a driver JVM
#: that starts fast (:data:`JVM_OPTIONS`).
SPARK_CONF: dict[str, str] = {
    "spark.driver.extraJavaOptions": JVM_OPTIONS,
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.streaming.noDataMicroBatches.enabled": "false",
    "spark.python.worker.reuse": "true",
    "spark.sql.session.timeZone": "UTC",
}


def session(app: str, master: str = "local[2]", **extra: str) -> Any:
    """A local SparkSession (``master``, default ``local[2]``) with :data:`SPARK_CONF` plus ``extra``
    settings, its log level ERROR, ``format("pgstreams")`` registered and the driver on loopback
    (``$SPARK_LOCAL_IP``, unless set)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import pgstreams.spark

    builder = SparkSession.builder.master(master).appName(app)
    for key, value in {**SPARK_CONF, **extra}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    pgstreams.spark.register(spark)
    return spark


def copy_query(spark: Any, dsn: str, checkpoint: str,
               stall: Callable[[int, int], None] | None = None) -> Any:
    """The ``DataStreamWriter`` (trigger not set) of a streaming copy of topic ``src`` into topic ``dst``
    with group ``copier`` and 100 events per trigger, through a Python UDF that calls
    ``stall(batch id, input partition)`` on every row when ``stall`` is given (default None)."""
    from pyspark.sql import functions as F

    def passthrough(value: bytes) -> bytes:
        if stall is not None:
            from pyspark import TaskContext

            ctx = TaskContext.get()
            assert ctx is not None
            stall(int(ctx.getLocalProperty("streaming.sql.batchId") or 0), ctx.partitionId())
        return value

    src = (spark.readStream.format("pgstreams").option("dsn", dsn).option("topic", "src")
           .option("maxEventsPerTrigger", "100").option("group", "copier").load())
    out = src.select("key", F.udf(passthrough, "binary", useArrow=False)("value").alias("value"), "partition")
    return (out.writeStream.format("pgstreams").option("dsn", dsn).option("topic", "dst")
            .option("checkpointLocation", checkpoint))


def _stall_in_second_batch(batch: int, partition: int) -> None:
    # from micro-batch 1 on, the task of input partition 1 stalls on its first row: the process is killed
    # while the other task of that batch has committed and this one has not
    if batch >= 1 and partition == 1:
        time.sleep(600)


def main(argv: list[str]) -> None:
    """Run the copy query with a processing-time trigger of 100 ms until the process is killed."""
    dsn, checkpoint = argv
    spark = session("pgstreams-killed-query")
    q = copy_query(spark, dsn, checkpoint, _stall_in_second_batch).trigger(processingTime="100 milliseconds")
    q.start().awaitTermination()


if __name__ == "__main__":
    main(sys.argv[1:])
