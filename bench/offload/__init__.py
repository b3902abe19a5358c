"""Where the derender tier wins (``python -m bench.offload``)."""
