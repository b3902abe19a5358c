"""The door to Ray Serve 2.60's private state this graph reads.

Each symbol here is private to Serve; ``tests/unit/test_serve_internals.py``
checks each against the installed Ray, so an upgrade that moves one fails
there, naming it.
"""

from __future__ import annotations


class ServeInternalsChanged(RuntimeError):
    """Ray Serve no longer has an internal this graph relies on (a Ray upgrade)."""


def replica_grpc_max_message_bytes() -> int:
    """The largest message a replica takes over Serve's gRPC data plane
    (``RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH``, read when the process started)."""
    try:
        from ray.serve._private.constants import RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH
    except ImportError as exc:
        raise ServeInternalsChanged(f"RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH: {exc}") from exc
    return int(RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH)
