"""Parts of ``python -m bench.peers``: what the peers need installed and started (:mod:`.setup`), CPU
accounting of benchmark processes (:mod:`.cpu`), the operations of each system (:mod:`.ours`,
:mod:`.pgq`, :mod:`.jetstream`) and the result tables (:mod:`.report`)."""
