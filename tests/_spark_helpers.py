"""Spark settings shared by the Spark tests, the class-data archive of the tests' JVMs, and the streaming
copy query that ``test_spark.test_query_killed_mid_batch_restarts_without_loss_or_duplicate`` kills and
restarts.

Run as a script (``python _spark_helpers.py DSN CHECKPOINT``), it starts that query in a SparkSession of
its own with a stall in micro-batch 1 and waits for it forever: the test kills the whole process. Run as
``python _spark_helpers.py --archive PATH``, it writes the class-data archive (see :func:`jvm_archive`).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _system import TEST_ROOT
from pgstreams.spark_daemon import use_compiled_pyspark

#: The options of every JVM the tests start (set in ``$JAVA_TOOL_OPTIONS`` by ``conftest.py``, so that the
#: drivers of subprocesses, Spark's standalone daemons and executors get them too): the client compiler
#: only and the serial collector. The tests' JVMs live a few seconds to a few minutes with small jobs: the
#: optimising compiler's threads and the parallel collector's cost more CPU than they save.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

#: The options that make a JVM map the class-data archive ``{path}`` (:func:`jvm_archive`) and stay quiet when
#: it cannot (a JVM with another class path, such as a tool that is not Spark, loads its classes as usual).
ARCHIVE_OPTIONS = "-XX:SharedArchiveFile={path} -Xlog:cds=off -Xlog:cds+dynamic=off"


#: How many class-data archives (of different pyspark installs) :func:`jvm_archive` keeps (200 MB each).
KEEP_ARCHIVES = 3


def archive_path() -> Path:
    """Where the class-data archive of this machine's Java and this pyspark is kept: a file named by a digest
    of both, under the tests' temporary folder (``pgstreams-test-<uid>/jvm``)."""
    import pyspark

    env = {k: v for k, v in os.environ.items() if k != "JAVA_TOOL_OPTIONS"}  # its echo is not the version
    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=True, env=env).stderr
    key = hashlib.sha1(f"{java}|{pyspark.__version__}|{pyspark.__file__}|{JVM_OPTIONS}".encode())
    return TEST_ROOT / "jvm" / f"{key.hexdigest()[:16]}.jsa"


def jvm_archive(wait: float = 600.0) -> Path | None:
    """The class-data archive of Spark's JVMs (a dynamic CDS archive of the classes a SparkSession loads to
    start, run SQL, a Python UDF, a stream and an ML fit), written the first time it is asked for and kept
    for later runs; None when it cannot be written (the JVMs then load their classes from the jars).

    A JVM that maps it starts a SparkSession with about 40 % less CPU (the classes come parsed and verified).
    One process writes it (``python _spark_helpers.py --archive PATH``, under a lock beside it); the others
    wait for that lock up to ``wait`` seconds."""
    path = archive_path()
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.2)
        if not path.exists():
            env = dict(os.environ, JAVA_TOOL_OPTIONS=JVM_OPTIONS)
            done = subprocess.run([sys.executable, __file__, "--archive", str(path)], env=env,
                                  capture_output=True, text=True, timeout=wait)
            if done.returncode != 0 or not path.exists():
                sys.stderr.write(f"no class-data archive for the JVMs: {done.stderr[-2000:]}\n")
                return None
            _prune(path.parent)
        return path


def _prune(folder: Path) -> None:
    """Remove the class-data archives of other installs (each clone's venv has its own) but the newest
    :data:`KEEP_ARCHIVES`, with their lock files."""
    def mtime(p: Path) -> float:
        try:
            return p.stat().st_mtime
        except OSError:  # removed meanwhile by another run
            return 0.0

    for old in sorted(folder.glob("*.jsa"), key=mtime)[:-KEEP_ARCHIVES]:
        old.unlink(missing_ok=True)
        old.with_suffix(".lock").unlink(missing_ok=True)


def jvm_options(archive: Path | None) -> str:
    """``$JAVA_TOOL_OPTIONS`` of the tests' JVMs: :data:`JVM_OPTIONS`, and the archive's when there is one."""
    return JVM_OPTIONS if archive is None else f"{JVM_OPTIONS} {ARCHIVE_OPTIONS.format(path=archive)}"


def _write_archive(path: Path) -> None:
    """Start a SparkSession in a JVM that dumps the classes it loaded into ``path`` when it exits, and run
    what the tests run: SQL, JSON, a Python UDF over Arrow, a stream, a logistic regression."""
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    os.environ["JAVA_TOOL_OPTIONS"] = f"{JVM_OPTIONS} -XX:ArchiveClassesAtExit={tmp} -Xlog:cds=off"
    spark = session("pgstreams-test-archive")
    from pyspark.ml.classification import LogisticRegression
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import functions as F

    df = spark.range(200).select((F.col("id") % 7).alias("k"), (F.col("id") % 2).cast("double").alias("y"),
                                 F.to_json(F.struct("id")).alias("j"))
    df.groupBy("k").agg(F.count("*"), F.max("j")).collect()
    df.select(F.udf(lambda v: v + 1, "long")("k"), F.from_json("j", "id long")).collect()
    feats = VectorAssembler(inputCols=["k"], outputCol="f").transform(df)
    LogisticRegression(featuresCol="f", labelCol="y", maxIter=3).fit(feats).transform(feats).count()
    q = spark.readStream.format("rate").option("rowsPerSecond", 100).load().writeStream.format("noop").start()
    q.processAllAvailable()
    q.stop()
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    spark.stop()
    # the JVM writes the archive when it exits, which it does when its standard input closes
    proc = gateway.proc  # type: ignore[union-attr]
    proc.stdin.close()
    proc.wait(timeout=300)
    if not tmp.exists() or tmp.stat().st_size == 0:
        raise SystemExit(f"the JVM wrote no archive to {tmp}")
    os.replace(tmp, path)


#: Settings of every SparkSession of the tests: no UI, two shuffle partitions and default parallelism
#: (``local[2]``), no empty micro-batches, Python workers reused and forked from pgstreams' daemon
#: (:mod:`pgstreams.spark_daemon`), UTC session time zone, a driver JVM that
#: starts fast (:data:`JVM_OPTIONS`), and the ML pipelines' own settings (``pgstreams_ml.sparkutil``), so
#: that the modules of the ``spark`` lane share one session.
SPARK_CONF: dict[str, str] = {
    "spark.driver.extraJavaOptions": JVM_OPTIONS,
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.streaming.noDataMicroBatches.enabled": "false",
    "spark.python.worker.reuse": "true",
    "spark.python.daemon.module": "pgstreams.spark_daemon",
    "spark.sql.session.timeZone": "UTC",
    "spark.python.authenticate.socketTimeout": "120s",
    "spark.network.timeout": "300s",
    "spark.driver.memory": "2g",
}


def session(app: str, master: str = "local[2]", **extra: str) -> Any:
    """A local SparkSession (``master``, default ``local[2]``) with :data:`SPARK_CONF` plus ``extra``
    settings, its log level ERROR, ``format("pgstreams")`` registered, the driver on loopback
    (``$SPARK_LOCAL_IP``, unless set) and Python workers that import the installed, compiled PySpark
    (:func:`pgstreams.spark_daemon.use_compiled_pyspark`).

    The session of this process when there is one (``extra`` then sets runtime settings only): the Spark
    modules of a run share one JVM, stopped when the run ends (``conftest.pytest_sessionfinish``). A module
    stops its own streaming queries."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    use_compiled_pyspark(master)
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
    """Run the copy query with a processing-time trigger of 100 ms until the process is killed (or, with
    ``--archive PATH``, write the class-data archive)."""
    if argv[0] == "--archive":
        _write_archive(Path(argv[1]))
        return
    dsn, checkpoint = argv
    spark = session("pgstreams-killed-query")
    q = copy_query(spark, dsn, checkpoint, _stall_in_second_batch).trigger(processingTime="100 milliseconds")
    q.start().awaitTermination()


if __name__ == "__main__":
    main(sys.argv[1:])
