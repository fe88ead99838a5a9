#!/usr/bin/env bash
# Makes sure the PostgreSQL JDBC driver is at /usr/share/java/postgresql.jar (Debian package
# libpostgresql-jdbc-java), installing it with apt-get when missing. Used by `python -m bench.spark`
# to run Spark's own JDBC source beside pgstreams. Prints the jar's path.
set -euo pipefail
JAR=/usr/share/java/postgresql.jar
if [ ! -f "$JAR" ]; then
    SUDO=""
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || { echo "ensure_jdbc.sh: $JAR missing; run as root or install sudo" >&2; exit 1; }
        SUDO=sudo
    fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get install -y -q libpostgresql-jdbc-java >/dev/null 2>&1 || {
        $SUDO apt-get update -q >/dev/null
        $SUDO apt-get install -y -q libpostgresql-jdbc-java >/dev/null
    }
fi
[ -f "$JAR" ] || { echo "ensure_jdbc.sh: $JAR still missing after installing libpostgresql-jdbc-java" >&2; exit 1; }
echo "$JAR"
