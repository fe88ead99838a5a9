"""``pgstreams demo``: the whole ML system end to end, on the embedded PostgreSQL unless a DSN is given.

Timeline (simulated time, for a run of duration ``D``, drift at ``0.5 D``, monitoring windows ``W``):

1. the simulator starts; the enrichment worker, the scorer workers and the three Spark queries (clean, join,
   monitor) run concurrently from the start;
2. once the training examples are final up to ``0.375 D``, model v1 is trained on ``[0, 0.25 D)``,
   evaluated on ``[0.25 D, 0.375 D)`` and deployed (the simulator does not pass ``0.375 D`` + 12 minutes
   before, so that a model serves before the drift);
3. at ``0.5 D`` the ground truth changes; the monitor flags degraded windows;
4. the first degraded window triggers a retrain on the ``0.1875 D`` after its start, evaluated on the next
   ``0.083 D``; it is deployed if it beats the deployed model on that holdout (the simulator waits for the
   decision 12 minutes after that holdout, so the new model serves the rest of the run). Without a flag
   within 4 windows of the change, the retrain is scheduled from the drift (from ``0.5 D`` without drift);
5. when the simulator is done and every pipeline has drained, the summary is printed and written with the
   plots to the reports folder.

Besides those gates, a throttle keeps the simulator at most ``0.15 D`` ahead of the final training examples
and of the monitor, so the story holds on a slow machine (``--speed`` is then an upper bound).

Modules: :mod:`.options` (:class:`DemoOptions`), :mod:`.runner` (:class:`Demo`, the orchestration),
:mod:`.progress` (the progress bars) and :mod:`.summary` (the summary and its quality bars).
"""

from __future__ import annotations

from .options import CLEAN_TRIGGER, SERVING_POOL, DemoError, DemoOptions
from .runner import Demo, DemoState, run_demo

__all__ = ["CLEAN_TRIGGER", "SERVING_POOL", "Demo", "DemoError", "DemoOptions", "DemoState", "run_demo"]
