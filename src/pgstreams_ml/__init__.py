"""pgstreams_ml: the reference ML application of pgstreams (install with ``pip install 'pgstreams[ml]'``).

A simulator emits ad impressions, clicks and conversions (with realistic dirt) into topics; Spark pipelines
clean them, join them with enrichment data kept in PostgreSQL into training examples, train a Spark MLlib
model kept in a model registry table, and evaluate the deployed model online; a worker group scores
impressions with the deployed model. ``pgstreams demo`` runs all of it; ``docs/ml-system.md`` draws it.

Modules: :mod:`.simulator`, :mod:`.enrichment`, :mod:`.clean`, :mod:`.join`, :mod:`.train`,
:mod:`.registry`, :mod:`.scoring`, :mod:`.monitor`, :mod:`.demo`; :mod:`.domain` holds the hidden ground
truth and the feature spec. Spark is imported only by the pipeline modules.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
