"""The one door to Ray Serve 2.60's private state this graph reads.

Each symbol here is private to Serve (or to Ray's actor machinery), and no
other module of the graph touches one. ``tests/integration/test_serve_internals.py``
checks each against Ray's own classes on a running Serve instance, so an
upgrade that moves one fails there, naming it. Where a read can fail softly
(the router state, the assignment future), the answer is "unknown" and the
graph behaves as Serve alone would.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import logging.handlers
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ray import serve
from ray.serve.deployment import Deployment
from ray.serve.handle import DeploymentHandle


class ServeInternalsChanged(RuntimeError):
    """Ray Serve no longer has an internal this graph relies on (a Ray upgrade)."""


def declared(import_path: str, *, name: str, **options: Any) -> Deployment:
    """A Serve deployment whose replicas import their class from ``import_path``
    (``"package.module.Class"``, as Serve parses it) as each starts: the process
    that builds the graph (the ``serve run`` CLI, or the task that builds a config's
    applications) never imports the class's module, and so never vLLM.

    ``@serve.deployment`` is typed for a class; its ``ReplicaConfig`` also takes
    an import path, which each replica resolves with
    ``replica._load_deployment_def_from_import_path``. Serve names a deployment
    after its class unless told: ``name`` is required here.
    """
    make: Any = serve.deployment(name=name, **options)
    deployment = make(import_path)
    if not isinstance(deployment, Deployment) or deployment.func_or_class != import_path:
        raise ServeInternalsChanged("serve.deployment no longer takes an import path")
    return deployment


def replica_class(import_path: str) -> Any:
    """What a replica of a deployment ``declared`` with ``import_path`` runs, found as
    Serve's replica finds it (``replica._load_deployment_def_from_import_path``)."""
    try:
        from ray.serve._private.replica import _load_deployment_def_from_import_path
    except ImportError as exc:
        raise ServeInternalsChanged(f"replica: {exc}") from exc
    return _load_deployment_def_from_import_path(import_path)


def replica_grpc_max_message_bytes() -> int:
    """The largest message a replica takes over Serve's gRPC data plane
    (``RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH``, read when the process started)."""
    try:
        from ray.serve._private.constants import RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH
    except ImportError as exc:
        raise ServeInternalsChanged(f"RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH: {exc}") from exc
    return int(RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH)


def on_this_process_data_plane(handle: DeploymentHandle[Any]) -> DeploymentHandle[Any]:
    """``handle`` with the data plane this process's Serve switches choose: Serve's gRPC
    under ``RAY_SERVE_THROUGHPUT_OPTIMIZED`` (``constants.RAY_SERVE_USE_GRPC_BY_DEFAULT``),
    else Ray actor calls.

    A handle carries its options where it goes, ``_by_reference`` included, and a
    handle passed to a replica's constructor was made in the process that built the
    graph, with that process's default. ``serve run graph:app`` imports Serve before
    ``graph.py`` sets the switches, so every hop of that graph went by reference
    (Ray actor calls through the object store): 0.6-0.75x the request rate at
    concurrency 16 on short chats, 1.4-1.7x the CPU per chat (docs/architecture.md).
    A replica starts with the switches in its environment, so it asks its own default."""
    try:
        from ray.serve._private.constants import RAY_SERVE_USE_GRPC_BY_DEFAULT
    except ImportError as exc:
        raise ServeInternalsChanged(f"constants.RAY_SERVE_USE_GRPC_BY_DEFAULT: {exc}") from exc
    return handle.options(_by_reference=not RAY_SERVE_USE_GRPC_BY_DEFAULT)


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


def serve_request_id() -> str:
    """The request id Serve's access log lines of this request carry, in every replica a
    handle call of it reaches (``context._serve_request_context``): the client's
    ``X-Request-Id``, else one Serve's proxy (or HAProxy) made. "" outside a request."""
    try:
        from ray.serve.context import _serve_request_context
    except ImportError as exc:
        raise ServeInternalsChanged(f"context._serve_request_context: {exc}") from exc
    context = _serve_request_context.get()
    return "" if context is None else str(context.request_id)


# What a request channel carries of a request's Serve context: (route, request id, app).
RequestFields = tuple[str, str, str]


def serve_request_fields() -> RequestFields:
    """The current request's Serve context as a request channel carries it to the
    callee (``context._serve_request_context``); empty outside a request."""
    try:
        from ray.serve.context import _serve_request_context
    except ImportError as exc:
        raise ServeInternalsChanged(f"context._serve_request_context: {exc}") from exc
    context = _serve_request_context.get()
    if context is None:
        return ("", "", "")
    return (str(context.route), str(context.request_id), str(context.app_name))


def enter_serve_request(fields: RequestFields) -> None:
    """In a task of its own: run as part of the request ``fields`` name, as a handle
    call of it would (``context._set_request_context``): Serve's log lines then carry
    its request id, and ``serve_request_id`` reads it."""
    if not any(fields):
        return
    try:
        from ray.serve.context import _set_request_context
    except ImportError as exc:
        raise ServeInternalsChanged(f"context._set_request_context: {exc}") from exc
    route, request_id, app_name = fields
    _set_request_context(route=route, request_id=request_id, app_name=app_name)


def serve_logger_name() -> str:
    """The logger Serve configures in each replica (``constants.SERVE_LOGGER_NAME``)."""
    try:
        from ray.serve._private.constants import SERVE_LOGGER_NAME
    except ImportError as exc:
        raise ServeInternalsChanged(f"constants.SERVE_LOGGER_NAME: {exc}") from exc
    return str(SERVE_LOGGER_NAME)


def replica_log_buffers() -> list[logging.handlers.MemoryHandler]:
    """The buffered handlers through which Serve writes a replica's log file
    (``logging_utils.configure_component_logger``; buffered under
    ``RAY_SERVE_THROUGHPUT_OPTIMIZED``)."""
    handlers = logging.getLogger(serve_logger_name()).handlers
    return [h for h in handlers if isinstance(h, logging.handlers.MemoryHandler)]


def drop_access_log_lines() -> None:
    """Serve's access log line for each call into this replica is dropped as it is
    made, before any handler formats or writes it: Serve's own filter for an
    ``enable_access_log: false`` deployment (``logging_utils.log_access_log_filter``,
    which reads the ``serve_access_log`` mark Serve puts on those records), set on
    the logger rather than on each handler, so it holds when Serve rebuilds its
    handlers and whatever ``logging_config`` the application sets."""
    try:
        from ray.serve._private.logging_utils import log_access_log_filter
    except ImportError as exc:
        raise ServeInternalsChanged(f"logging_utils.log_access_log_filter: {exc}") from exc
    logger = logging.getLogger(serve_logger_name())
    if log_access_log_filter not in logger.filters:
        logger.addFilter(log_access_log_filter)


@dataclass(frozen=True)
class RouterView:
    """What a handle's router knows of its deployment's replicas right now."""

    running: int
    """Running replicas it may send to (those it saw die under a request left out)."""
    scales_to_zero: bool | None
    """Whether the deployment may have no replica by design (None: not told yet)."""


def router_view(handle: DeploymentHandle[Any]) -> RouterView | None:
    """The handle's router state, or None while unknown: before the router has
    heard of any replica, or on a Ray that keeps it elsewhere.

    Reads ``DeploymentHandle._router._asyncio_router`` and, there,
    ``running_replicas_populated()``, ``_request_router.curr_replicas`` (or
    ``_running_replicas`` before the first request builds the request router)
    and ``_metrics_manager._deployment_config.autoscaling_config``: the running
    replicas and config the Serve controller pushes to every handle (long poll).
    """
    router = getattr(getattr(handle, "_router", None), "_asyncio_router", None)
    if router is None or not router.running_replicas_populated():
        return None
    request_router = getattr(router, "_request_router", None)
    if request_router is not None:
        running = len(request_router.curr_replicas)
    else:
        pending = getattr(router, "_running_replicas", None)
        if pending is None:
            return None
        running = len(pending)
    config = getattr(getattr(router, "_metrics_manager", None), "_deployment_config", None)
    if config is None:
        return RouterView(running, None)
    autoscaling = config.autoscaling_config
    return RouterView(running, autoscaling is not None and autoscaling.min_replicas == 0)


def assignment_future(
    response: Any,
) -> concurrent.futures.Future[Any] | asyncio.Future[Any] | None:
    """The future a handle call's response holds until Serve's router has given the
    call a replica (``DeploymentResponse._replica_result_future``, and the same on
    ``DeploymentResponseGenerator``); None if unknown."""
    return getattr(response, "_replica_result_future", None)


# ``DeploymentHandle.choose_replica``'s pick-only switch (``AsyncioRouter.choose_replica``):
# the configured request router orders the replicas, and no slot is reserved on the
# one picked (that costs a call to it, what a request channel saves).
PICK_ONLY = {"_reserve": False}
# The keyword argument that tells the graph's routers a call is a pick, not a call,
# with the picking caller's requests in flight (``PrefixRouter`` records where it sent
# the request then).
PICKING = "picking"


async def pick_replica(
    handle: DeploymentHandle[Any], *args: Any, loads: dict[str, int], **kwargs: Any
) -> str | None:
    """The unique id of the replica ``handle``'s request router picks for a call with
    these arguments, nothing sent or reserved; None where Serve no longer picks so
    (a Ray upgrade): the caller then makes the call as Serve routes it. ``loads``:
    the caller's requests in flight by replica, which the graph's routers weigh
    (``PICKING``), since Serve's router never hears of a request it only picked."""
    try:
        picking = {**kwargs, **PICK_ONLY, PICKING: loads}
        async with handle.choose_replica(*args, **picking) as selection:
            return str(selection.replica_id)
    except (TypeError, AttributeError, RuntimeError) as exc:
        logging.getLogger("ray.serve").warning(
            "Serve's router cannot pick without sending: %r", exc
        )
        return None


def replica_max_ongoing_requests() -> int:
    """In a replica: its deployment's ``max_ongoing_requests`` as Serve runs it
    (``ReplicaContext._deployment_config``)."""
    config = getattr(serve.get_replica_context(), "_deployment_config", None)
    value = getattr(config, "max_ongoing_requests", None)
    if not isinstance(value, int):
        raise ServeInternalsChanged("ReplicaContext._deployment_config.max_ongoing_requests")
    return value


def draining_probe() -> Callable[[], bool]:
    """In a replica: a function that says whether Serve has begun to stop it (a
    scale-in, a redeploy, ``serve shutdown``).

    Serve gives user code no hook when it starts to stop a replica: ``__del__`` runs
    after the drain, which waits for every ongoing request up to
    ``graceful_shutdown_timeout_s``. It reads ``Replica._shutting_down``, set first
    thing in ``Replica._perform_graceful_shutdown``, on this process's
    ``ReplicaActor`` (``ray._private.worker.global_worker.actors[actor_id]._replica_impl``).
    """
    try:
        from ray._private.worker import global_worker

        replica = global_worker.actors[global_worker.actor_id]._replica_impl
        if not isinstance(replica._shutting_down, bool):
            raise TypeError(f"_shutting_down is a {type(replica._shutting_down).__name__}")
    except (ImportError, KeyError, AttributeError, TypeError) as exc:
        raise ServeInternalsChanged(f"ReplicaActor._replica_impl._shutting_down: {exc!r}") from exc

    def draining() -> bool:
        return bool(replica._shutting_down)

    return draining


def ping_actor(actor: Any) -> Awaitable[Any]:
    """Ray's own liveness call on an actor (``__ray_ready__``), which Serve does not
    count against a replica's ``max_ongoing_requests``: a dead actor raises
    ``RayActorError``."""
    method = getattr(actor, "__ray_ready__", None)
    if method is None:
        raise ServeInternalsChanged("ActorHandle.__ray_ready__ is gone")
    result: Awaitable[Any] = method.remote()
    return result
