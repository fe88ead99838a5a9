"""docs/spark.md runs (tests/_docs.py, notebook mode): its blocks in order in one interpreter, as in a
notebook or the ``pyspark`` shell, with the virtual environment's python run by its path (not activated:
no ``bin`` folder on ``PATH``, no ``$PYSPARK_PYTHON``) and no ``dsn`` option (the DSN is found as
``pgstreams.connect()`` finds it)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from _docs import DocRunner, blocks

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "spark.md"


def test_every_code_block_of_the_spark_page_runs_with_the_venv_python_not_activated(
        dsn: str, tmp_path: Path) -> None:
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PGSTREAMS_", "PYSPARK_")) and k not in ("VIRTUAL_ENV", "PATH")}
    env.update(PATH=path, PGSTREAMS_DSN=dsn, HOME=str(tmp_path / "home"))
    runner = DocRunner(tmp_path / "work", env, timeout=300, activate=False, notebook=True)
    runner.run_page(PAGE)
    assert [b.first_line for b in runner.skipped] == ["pip install 'pgstreams[spark]'      # pyspark >= 4.0, "
                                                      "pyarrow, numpy; Java 17 for Spark"]
    assert runner.ran == [b for b in blocks(PAGE) if b.runs]
    # the first Spark example names no DSN: the read found the page's database through $PGSTREAMS_DSN
    first = next(b for b in runner.ran if "SparkSession" in b.code)
    code = [ln for ln in first.code.splitlines() if not ln.lstrip().startswith("#")]
    assert not [ln for ln in code if 'option("dsn"' in ln]
