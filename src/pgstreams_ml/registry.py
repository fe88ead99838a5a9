"""The model registry: models with their artefact, metrics and lineage in a PostgreSQL table.

A model's artefact is a zip (stored as ``bytea``) holding the Spark MLlib model directory (``mllib/``) and
``model.json`` (feature names, coefficients, intercept): Spark loads the former, the online scorer the
latter without Spark. Status goes ``candidate`` -> ``deployed`` (at most one per name) -> ``retired``, or
``candidate`` -> ``rejected``. Promotion happens in one transaction that locks the deployed row, so two
trainers racing cannot both deploy; a ``pg_notify`` on channel ``<schema>_model_deployed`` tells scorers.
"""

from __future__ import annotations

import io
import json
import math
import os
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from . import _sql
from .domain import FEATURE_NAMES, feature_vector, sigmoid

#: The artefact format written by :func:`pack_artefact`.
ARTEFACT_FORMAT = "zip:mllib-logreg+json/v1"


@dataclass(frozen=True)
class ScoringModel:
    """A logistic regression over :data:`pgstreams_ml.domain.FEATURE_NAMES`, scored in plain Python."""

    model_id: int
    intercept: float
    coefficients: tuple[float, ...]
    features: tuple[str, ...] = FEATURE_NAMES

    def predict(self, row: Mapping[str, Any]) -> float:
        """Click probability for a mapping of the raw inputs (profile, catalogue entry, context)."""
        x = feature_vector(row)
        return sigmoid(self.intercept + math.fsum(c * v for c, v in zip(self.coefficients, x, strict=True)))


@dataclass(frozen=True)
class ModelRecord:
    """A registry row without its artefact bytes."""

    model_id: int
    name: str
    status: str
    created_at: datetime
    deployed_at: datetime | None
    params: dict[str, Any]
    metrics: dict[str, Any]
    lineage: dict[str, Any]
    decision: dict[str, Any] | None


def pack_artefact(mllib_dir: str | None, intercept: float, coefficients: Sequence[float]) -> bytes:
    """Zip ``mllib_dir`` (if given) under ``mllib/`` with ``model.json``."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(
            "model.json",
            json.dumps(
                {
                    "format": ARTEFACT_FORMAT,
                    "features": list(FEATURE_NAMES),
                    "intercept": intercept,
                    "coefficients": list(coefficients),
                }
            ),
        )
        if mllib_dir:
            for root, _dirs, files in os.walk(mllib_dir):
                for f in files:
                    full = os.path.join(root, f)
                    zf.write(full, os.path.join("mllib", os.path.relpath(full, mllib_dir)))
    return buf.getvalue()


def unpack_model_json(artefact: bytes) -> dict[str, Any]:
    """The ``model.json`` of an artefact."""
    with zipfile.ZipFile(io.BytesIO(artefact)) as zf:
        out: dict[str, Any] = json.loads(zf.read("model.json"))
        return out


def extract_mllib(artefact: bytes, target: str) -> str:
    """Extract the artefact's MLlib directory under ``target``; return its path."""
    with zipfile.ZipFile(io.BytesIO(artefact)) as zf:
        for name in zf.namelist():
            if name.startswith("mllib/"):
                zf.extract(name, target)
    return os.path.join(target, "mllib")


def scoring_model(model_id: int, artefact: bytes) -> ScoringModel:
    """The plain-Python scorer of an artefact; raises ``ValueError`` if its features differ from ours."""
    spec = unpack_model_json(artefact)
    if tuple(spec["features"]) != FEATURE_NAMES:
        raise ValueError(f"model {model_id} was trained on other features: {spec['features']}")
    return ScoringModel(model_id, float(spec["intercept"]), tuple(float(c) for c in spec["coefficients"]))


def register(
    conn: psycopg.Connection,
    schema: str,
    name: str,
    artefact: bytes,
    params: Mapping[str, Any],
    metrics: Mapping[str, Any],
    lineage: Mapping[str, Any],
) -> int:
    """Store a candidate model; return its id."""
    row = conn.execute(
        _sql.q("register_model", schema),
        (name, ARTEFACT_FORMAT, artefact, Jsonb(dict(params)), Jsonb(dict(metrics)), Jsonb(dict(lineage))),
    ).fetchone()
    assert row is not None
    return int(row[0])


def _record(row: Sequence[Any]) -> ModelRecord:
    return ModelRecord(int(row[0]), row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8])


def get(conn: psycopg.Connection, schema: str, model_id: int) -> ModelRecord | None:
    """A model by id."""
    row = conn.execute(_sql.q("get_model", schema), (model_id,)).fetchone()
    return None if row is None else _record(row)


def deployed(conn: psycopg.Connection, schema: str, name: str) -> ModelRecord | None:
    """The deployed model of ``name``, if any."""
    row = conn.execute(_sql.q("deployed_model", schema), (name,)).fetchone()
    return None if row is None else _record(row)


def deployed_id(conn: psycopg.Connection, schema: str, name: str) -> int | None:
    """The id of the deployed model of ``name`` (a cheap query for reload checks)."""
    row = conn.execute(_sql.q("deployed_model_id", schema), (name,)).fetchone()
    return None if row is None else int(row[0])


def artefact(conn: psycopg.Connection, schema: str, model_id: int) -> bytes:
    """A model's artefact bytes."""
    row = conn.execute(_sql.q("model_artefact", schema), (model_id,)).fetchone()
    if row is None:
        raise LookupError(f"model {model_id} does not exist")
    return bytes(row[0])


def list_models(conn: psycopg.Connection, schema: str) -> list[ModelRecord]:
    """Every model, oldest first."""
    return [_record(r) for r in conn.execute(_sql.q("list_models", schema)).fetchall()]


def promote_if_better(
    conn: psycopg.Connection,
    schema: str,
    name: str,
    model_id: int,
    candidate_score: float,
    deployed_score: float | None,
    compared_with: int | None,
    metric: str = "auc",
    min_gain: float = 0.0,
) -> bool:
    """Deploy candidate ``model_id`` if no model of ``name`` is deployed, or if ``candidate_score`` beats
    ``deployed_score`` (the deployed model ``compared_with`` measured on the same holdout) by more than
    ``min_gain`` (default 0); otherwise mark it rejected. Records the decision; returns whether it was
    deployed.

    Runs in one transaction on ``conn`` that locks the deployed row: if the deployed model is no longer
    ``compared_with`` (another trainer deployed meanwhile), the candidate is rejected, not compared with a
    stale score.
    """
    with conn.transaction():
        conn.execute(_sql.q("promote_lock", schema), (name,))
        current = conn.execute(_sql.q("lock_deployed", schema), (name,)).fetchone()
        current_id = None if current is None else int(current[0])
        if current_id != compared_with:
            promote, why = False, f"deployed model changed to {current_id} meanwhile; not compared"
        elif current_id is None:
            promote, why = True, "no model deployed"
        elif deployed_score is not None and candidate_score > deployed_score + min_gain:
            promote = True
            why = f"{metric} {candidate_score:.4f} beats deployed model {current_id} ({deployed_score:.4f})"
        else:
            promote = False
            why = (
                f"{metric} {candidate_score:.4f} does not beat deployed model {current_id} ({deployed_score})"
            )
        decision = Jsonb(
            {
                "promoted": promote,
                "reason": why,
                "metric": metric,
                "candidate": candidate_score,
                "deployed": deployed_score,
                "deployed_model_id": current_id,
            }
        )
        if promote:
            if current_id is not None:
                conn.execute(_sql.q("retire_model", schema), (current_id,))
            conn.execute(_sql.q("deploy_model", schema), (decision, model_id))
            conn.execute("SELECT pg_notify(%s, %s)", (f"{schema}_model_deployed", str(model_id)))
        else:
            conn.execute(_sql.q("reject_model", schema), (decision, model_id))
    return promote
