#!/usr/bin/env bash
# Runs the whole pgstreams test suite.
# Creates .venv (if missing), installs pgstreams with every extra, then runs pytest in parallel.
# Uses $PGSTREAMS_TEST_DSN when set, otherwise an embedded PostgreSQL started by the tests.
# Needs Python >= 3.11 and Java 17 (for the Spark tests). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "pgstreams needs Python >= 3.11")'
command -v java >/dev/null || { echo "test.sh: java (17) is required for the Spark tests" >&2; exit 1; }
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[spark,ml,dev,metrics,console,kafka]"
exec .venv/bin/python -m pytest -n "${PGSTREAMS_TEST_WORKERS:-4}" --dist loadgroup "$@"
