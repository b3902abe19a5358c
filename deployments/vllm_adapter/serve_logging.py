"""Serve's replica log survives vLLM's logging setup.

vLLM's engine applies its logging config with ``logging.config.dictConfig``
(``AsyncLLM.__init__`` → ``configure_logging_if_needed``), and a
non-incremental ``dictConfig`` closes every handler in the process first,
Serve's own included. Serve's replica logger writes through a
``MemoryHandler`` whose ``close`` drops its target file handler. Seen on the
cluster tests: after a Serve controller restart, the new controller asks each
replica ``is_allocated``, which reads that handler's file name; on a Generate
replica it raised ``AttributeError``, so the controller stopped a healthy
replica and started another, 50 s without an engine. Request logs after the
engine started were lost too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from deployments.transport.serve_internals import replica_log_buffers


@contextlib.contextmanager
def serve_log_kept() -> Iterator[None]:
    """Within: anything may reconfigure logging; after: Serve's buffered handlers write
    to their files again (a closed file handler reopens on its next record)."""
    targets = [(handler, handler.target) for handler in replica_log_buffers()]
    try:
        yield
    finally:
        for handler, target in targets:
            if handler.target is None and target is not None:
                handler.setTarget(target)
