"""``python -m pgstreams.cli``: the ``pgstreams`` command line."""

from __future__ import annotations

from . import main

if __name__ == "__main__":
    main()
