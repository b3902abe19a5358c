"""The door to Ray Serve 2.60's private state this graph reads.

Each symbol here is private to Serve; ``tests/unit/test_serve_internals.py``
checks each against the installed Ray, so an upgrade that moves one fails
there, naming it.
"""

from __future__ import annotations

from typing import Any


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


def proxy_asgi_stack(app: Any, middlewares: list[Any]) -> Any:
    """``app`` wrapped as Serve's HTTP proxy wraps it: Serve's ``RequestIdMiddleware``
    innermost, ``middlewares`` (what ``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH``
    gives) outside it (``http_util._apply_middlewares``). For tests of what the
    proxy does to a request."""
    try:
        from ray.serve._private.http_util import _apply_middlewares
    except ImportError as exc:
        raise ServeInternalsChanged(f"http_util._apply_middlewares: {exc}") from exc
    return _apply_middlewares(app, middlewares)


def proxy_request_id() -> str:
    """An id as Serve's proxy makes one for a request without ``X-Request-Id``."""
    try:
        from ray.serve._private.utils import generate_request_id
    except ImportError as exc:
        raise ServeInternalsChanged(f"utils.generate_request_id: {exc}") from exc
    return str(generate_request_id())
