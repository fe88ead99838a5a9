"""pgstreams benchmarks. Each module is one command (``python -m bench.core``) that measures pgstreams and
the raw PostgreSQL limit in the same run and prints both with their ratio."""

from __future__ import annotations
