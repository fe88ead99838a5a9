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

Every Python process Spark starts (this daemon, PySpark's daemons for its data source planners and
streaming sinks, the runner of each streaming query's Python source) finds PySpark first in the zip
archive that Spark puts on its ``PYTHONPATH`` (``$SPARK_HOME/python/lib/pyspark.zip``), which Python
compiles anew in each process: about 1 s of CPU per process. For a PySpark installed as a Python package,
:func:`use_compiled_pyspark` points ``SPARK_HOME`` at a folder that is the installed PySpark without those
archives, so that those processes import the installed, compiled PySpark instead.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import sys
import uuid
from collections.abc import MutableMapping
from pathlib import Path

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


def compiled_spark_home(cache: Path | None = None) -> Path | None:
    """A Spark home for the installed PySpark whose Python processes import the installed (compiled)
    PySpark and py4j: a folder of ``cache`` (default ``$XDG_CACHE_HOME/pgstreams``, else
    ``~/.cache/pgstreams``) linking to every part of the installed PySpark (scripts, jars, configuration)
    but the zip archives of ``python/lib``, made once per installation. ``None`` when PySpark is not an
    installed Python package with those archives (a Spark distribution of its own keeps its home), or the
    folder cannot be made."""
    try:
        import pyspark
    except ImportError:
        return None
    real = Path(pyspark.__file__).resolve().parent
    lib = real / "python" / "lib"
    if not (real / "jars").is_dir() or not (lib / "pyspark.zip").is_file():
        return None
    if cache is None:
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pgstreams"
    key = hashlib.sha256(str(real).encode()).hexdigest()[:12]
    home = cache / f"spark-home-{pyspark.__version__}-{key}"
    if _links_to(home, real):
        return home
    building = cache / f".{home.name}.{uuid.uuid4().hex}"
    try:
        (building / "python" / "lib").mkdir(parents=True)
        for entry in real.iterdir():
            if entry.name != "python":
                (building / entry.name).symlink_to(entry)
        for entry in (real / "python").iterdir():
            if entry.name != "lib":
                (building / "python" / entry.name).symlink_to(entry)
        for entry in lib.iterdir():
            if entry.suffix != ".zip":
                (building / "python" / "lib" / entry.name).symlink_to(entry)
        building.rename(home)  # at once, complete; another process may have made it meanwhile
    except OSError:
        pass
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return home if _links_to(home, real) else None


def _links_to(home: Path, real: Path) -> bool:
    """Whether ``home`` is a complete :func:`compiled_spark_home` of the PySpark installed in ``real``."""
    return ((home / "jars").resolve() == (real / "jars").resolve()
            and (home / "bin").resolve() == (real / "bin").resolve()
            and (home / "python" / "lib").is_dir())


def use_compiled_pyspark(master: str, environ: MutableMapping[str, str] = os.environ) -> str | None:
    """For a session of ``master`` (``local...`` or a standalone ``spark://...``), point ``SPARK_HOME`` in
    ``environ`` (default: this process's environment, which a session reads when it starts its JVM) at
    :func:`compiled_spark_home`, when it is unset or names the installed PySpark itself; return the
    ``SPARK_HOME`` in effect then, or ``None`` when it was left alone: a Spark distribution of its own, or
    another master (YARN and Kubernetes ship the archives from ``SPARK_HOME`` to their executors)."""
    if not master.startswith(("local", "spark://")):
        return None
    try:
        import pyspark
    except ImportError:
        return None
    home = compiled_spark_home()
    current = environ.get("SPARK_HOME")
    if home is None or (current and current != str(home)
                        and Path(current).resolve() != Path(pyspark.__file__).resolve().parent):
        return None
    environ["SPARK_HOME"] = str(home)
    return str(home)


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
