#!/usr/bin/env bash
# Runs the whole pgstreams test suite.
# Creates .venv (if missing), installs pgstreams with every extra, then runs pytest in parallel.
# Uses $PGSTREAMS_TEST_DSN when set, otherwise an embedded PostgreSQL started by the tests.
# Needs Python >= 3.11 and Java 17 (for the Spark tests); installs Debian's kcat and Node.js (for the Kafka
# conformance tests) and PgBouncer (for the tests behind a connection pooler) when missing (as root; otherwise
# says what to install) and KafkaJS. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "pgstreams needs Python >= 3.11")'
command -v java >/dev/null || { echo "test.sh: java (17) is required for the Spark tests" >&2; exit 1; }
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[spark,ml,dev,metrics,console,kafka]"
# The Kafka conformance tests' other clients: Debian's kcat, and KafkaJS (Node.js); the pooler tests' PgBouncer
# (tests/faults/test_pooler.py). Installed when missing.
need=()
command -v kcat >/dev/null || need+=(kcat)
command -v npm >/dev/null || need+=(nodejs npm)
[ -x /usr/sbin/pgbouncer ] || need+=(pgbouncer)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get install -y -q "${need[@]}" >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null && apt-get install -y -q "${need[@]}" >/dev/null; }
  else
    echo "test.sh: the tests need ${need[*]}: install them (apt-get install ${need[*]})" >&2
    exit 1
  fi
fi
[ -d tests/conformance/kafkajs/node_modules/kafkajs ] \
  || npm ci --prefix tests/conformance/kafkajs --no-audit --no-fund --silent
# Python's bytecode of the checkout (src, tests, bench), compiled once: the suite starts hundreds of Python
# processes (CLI commands, benchmarks, Spark's Python workers) that would otherwise each compile pgstreams from
# source when the environment sets PYTHONDONTWRITEBYTECODE; for the same reason pytest may cache its rewritten
# test modules (in __pycache__, ignored by git) for this run.
.venv/bin/python -m compileall -q -j 0 src tests bench >/dev/null
unset PYTHONDONTWRITEBYTECODE
exec .venv/bin/python -m pytest -n "${PGSTREAMS_TEST_WORKERS:-4}" --dist loadgroup "$@"
