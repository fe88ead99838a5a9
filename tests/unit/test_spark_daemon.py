"""``pgstreams.spark_daemon``: PySpark's daemon, with pgstreams and psycopg imported before it forks, and
PySpark's own daemon in its place when a preloaded module started a thread (each case in a fresh
interpreter: this one runs threads of its own); the Spark home whose Python processes import the installed,
compiled PySpark."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

_THREAD_STARTER = ("import threading, time\n"
                   "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n")


def _python(code: str, path: Path | None = None) -> str:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_preloaded_modules_start_no_thread_and_are_loaded() -> None:
    out = _python("import sys\nfrom pgstreams.spark_daemon import PRELOADED, preload, threads\n"
                  "print(preload(), threads(), all(m in sys.modules for m in PRELOADED))")
    assert out == "True 1 True"


def test_a_preloaded_module_that_starts_a_thread_is_noticed(tmp_path: Path) -> None:
    (tmp_path / "starts_a_thread.py").write_text(_THREAD_STARTER)
    out = _python("from pgstreams.spark_daemon import preload\nprint(preload(('starts_a_thread',)))",
                  tmp_path)
    assert out == "False"


def test_the_daemon_runs_pysparks_own_in_its_place_after_a_thread_started(tmp_path: Path) -> None:
    """With a preloaded module that starts a thread, the process becomes ``python -m pyspark.daemon`` (same
    process, same worker module) and serves as PySpark's daemon: it writes its port, and ends when its
    standard input closes."""
    (tmp_path / "starts_a_thread.py").write_text(_THREAD_STARTER)
    code = ("import sys\nimport pgstreams.spark_daemon as d\n"
            "d.PRELOADED = ('starts_a_thread',) + d.PRELOADED\n"
            "sys.argv = ['daemon', 'pyspark.worker']\nd.main()")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    with subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=env) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        head = proc.stdout.read(4)
        assert len(head) == 4, proc.stderr.read() if proc.stderr else b""
        (port,) = struct.unpack(">i", head)
        assert 0 < port < 65536
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert b"pyspark.daemon" in cmdline and b"pyspark.worker" in cmdline, cmdline
        assert len(os.listdir(f"/proc/{proc.pid}/task")) == 1  # the thread did not survive the exec
        proc.stdin.close()
        proc.wait(60)  # it ends when its standard input closes, as told (else TimeoutExpired)


def test_the_compiled_spark_home_is_the_installed_pyspark_without_its_archives(tmp_path: Path) -> None:
    """Made once, complete, by several processes at once: the same folder for each, linking to the
    installed PySpark's scripts and jars, with no archive of PySpark or py4j on Spark's Python path."""
    import pyspark

    real = Path(pyspark.__file__).resolve().parent
    code = ("import sys\nfrom pathlib import Path\nfrom pgstreams.spark_daemon import compiled_spark_home\n"
            f"print(compiled_spark_home(Path({str(tmp_path)!r})))")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    homes = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert len(homes) == 1, homes
    home = Path(homes.pop())
    assert home.parent == tmp_path and pyspark.__version__ in home.name
    assert (home / "jars").resolve() == real / "jars" and (home / "bin" / "spark-submit").is_file()
    assert (real / "python" / "lib" / "pyspark.zip").is_file()
    assert not list((home / "python" / "lib").glob("*.zip"))
    assert [p.name for p in tmp_path.iterdir()] == [home.name]  # nothing half-made left behind


def test_use_compiled_pyspark_leaves_another_spark_home_and_other_masters_alone(tmp_path: Path) -> None:
    import pyspark

    from pgstreams.spark_daemon import use_compiled_pyspark

    real = str(Path(pyspark.__file__).resolve().parent)
    env: dict[str, str] = {}
    home = use_compiled_pyspark("local[2]", env)
    assert home is not None and env == {"SPARK_HOME": home} and home != real
    assert use_compiled_pyspark("local[2]", env) == home  # again: the same
    pointed = {"SPARK_HOME": real}  # the installed PySpark itself: the same Spark, compiled
    assert use_compiled_pyspark("spark://127.0.0.1:7077", pointed) == home and pointed["SPARK_HOME"] == home
    own = {"SPARK_HOME": str(tmp_path)}  # a Spark distribution of its own
    assert use_compiled_pyspark("local[2]", own) is None and own == {"SPARK_HOME": str(tmp_path)}
    yarn: dict[str, str] = {}  # YARN ships the archives of SPARK_HOME to its executors
    assert use_compiled_pyspark("yarn", yarn) is None and yarn == {}
