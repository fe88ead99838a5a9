"""Every code block of the README and of docs/ runs (tests/_docs.py): each page's blocks in order, in a
database of the page's own, shell blocks through the real command line, Python blocks as scripts.

docs/spark.md runs in tests/spark/test_spark_docs.py (it starts Spark, in the spark lane). The blocks
that do not run are listed here with the reason the page gives: a new one is a change of this list.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from _docs import DocRunner, blocks

ROOT = Path(__file__).resolve().parents[2]

#: The pages whose blocks run here.
PAGES = [
    "README.md", "docs/aio.md", "docs/shares.md", "docs/workers.md", "docs/metrics.md", "docs/sql.md",
    "docs/cli.md", "docs/shards.md", "docs/ml-system.md", "docs/operations.md", "docs/security.md",
    "docs/console.md", "docs/kafka.md", "docs/architecture.md", "docs/design.md", "docs/benchmarks.md",
]
#: Pages that are not run here: the record of earlier benchmark runs (commands of code that no longer
#: exists); docs/spark.md and docs/cdc.md, run by tests/spark/test_spark_docs.py and
#: tests/integration/test_cdc.py (a server with wal_level = logical).
NOT_RUN = {"docs/benchmarks-history.md", "docs/spark.md", "docs/cdc.md"}

#: Per page, the beginnings of the first lines of the blocks that do not run (their reasons are on the page).
SKIPPED: dict[str, list[str]] = {
    "README.md": ["./demo.sh     # the main job", "pip install -e .            # core"],
    "docs/shards.md": ["import pgstreams"],
    "docs/ml-system.md": ["./demo.sh                       # creates .venv", "pgstreams sim --duration 2h",
                          "python -m bench.ml_latency --from-topics", "./demo.sh --master spark://HOST:7077"],
}


def test_every_page_is_run_or_listed() -> None:
    pages = {str(p.relative_to(ROOT)) for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
    assert pages == set(PAGES) | NOT_RUN


@pytest.mark.parametrize("page", PAGES)
def test_every_code_block_of_the_page_runs(page: str, dsn: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGSTREAMS_")}
    runner = DocRunner(tmp_path / "work", dict(env, PGSTREAMS_DSN=dsn, HOME=str(tmp_path / "home")))
    runner.run_page(ROOT / page)
    skipped = [b.first_line for b in runner.skipped]
    expected = SKIPPED.get(page, [])
    assert len(skipped) == len(expected), skipped
    assert all(line.startswith(start) for line, start in zip(skipped, expected, strict=True)), skipped
    runnable = [b for b in blocks(ROOT / page) if b.runs]
    assert runner.ran == runnable
