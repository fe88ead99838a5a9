#!/usr/bin/env bash
# The main job: runs the ML reference system end to end with `pgstreams demo`.
# Creates .venv (if missing), installs pgstreams with the ml extra, then runs the demo: a simulator, Spark
# pipelines (clean, join, training, monitoring), a model registry and online scoring, all on PostgreSQL.
# Uses $PGSTREAMS_DSN (or --dsn) when set, otherwise an embedded PostgreSQL (data under $PGSTREAMS_HOME or
# ~/.local/share/pgstreams). Needs Python >= 3.11 and Java 17. Extra arguments go to `pgstreams demo`
# (see `./demo.sh --help`); the summary, summary.json and PNG plots go to ./reports (--reports DIR).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "pgstreams needs Python >= 3.11")'
command -v java >/dev/null || { echo "demo.sh: java (17) is required for Spark" >&2; exit 1; }
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[ml]"
# the checkout's bytecode, compiled once (the demo starts several Python processes that import pgstreams)
.venv/bin/python -m compileall -q -j 0 src >/dev/null
exec .venv/bin/pgstreams demo "$@"
