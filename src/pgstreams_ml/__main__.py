"""``python -m pgstreams_ml PART``: run one part of the ML application (see :mod:`pgstreams_ml.cli`)."""

from __future__ import annotations

from .cli import main

if __name__ == "__main__":
    main()
