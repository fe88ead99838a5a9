"""Parts of the read-fence benchmark (``python -m bench.fence``)."""
