"""What a failed handle call says of the replica that took it: lost, or not.

A replica is lost when its actor died or cannot be reached (Serve's router has
already taken it out of rotation), and a Generate replica is lost to its calls
as soon as its engine died: it exits within a second (``Generate``'s watchdog),
and raises :class:`EngineLostError` in every call its engine ended meanwhile,
so its callers know the call may be made again elsewhere
(``transport/migration.py``) rather than told as the engine's error. A Generate
replica that Serve stops (a scale-in, a redeploy) ends its calls the same way,
with :class:`ReplicaLeavingError`, rather than have them cut when its grace
period runs out.
"""

from __future__ import annotations

from ray.exceptions import ActorDiedError, ActorUnavailableError, RayTaskError

from deployments.transport.step_channel import ChannelClosedError


class EngineLostError(RuntimeError):
    """The engine of Generate replica ``replica`` (its unique id) died under this
    call; the replica is leaving, but its callers' routers may not know yet."""

    def __init__(self, replica: str):
        super().__init__(f"the engine of Generate replica {replica} died")
        self.replica = replica

    def __reduce__(self) -> tuple[type[EngineLostError], tuple[str]]:
        return EngineLostError, (self.replica,)


class ReplicaLeavingError(EngineLostError):
    """Serve is stopping replica ``replica`` (a scale-in, a redeploy): it takes no more
    calls, and a Generate replica hands those it runs back to their callers, to be
    made again on another replica (``transport/leaving.py``)."""

    def __init__(self, replica: str):
        RuntimeError.__init__(self, f"replica {replica} is being stopped")
        self.replica = replica

    def __reduce__(self) -> tuple[type[ReplicaLeavingError], tuple[str]]:
        return ReplicaLeavingError, (self.replica,)


def lost_engine_replica(exc: BaseException) -> str | None:
    """The replica whose engine died under a failed call, if that is why it failed."""
    cause = raised_in_tier(exc) if isinstance(exc, Exception) else exc
    return cause.replica if isinstance(cause, EngineLostError) else None


def raised_in_tier(exc: Exception) -> Exception:
    """What the tier raised under a failed call.

    Over the object store, Ray wraps it in a ``RayTaskError`` that holds it as
    ``cause``; over Serve's gRPC data plane it arrives as itself.
    """
    cause = getattr(exc, "cause", None)
    return cause if isinstance(exc, RayTaskError) and isinstance(cause, Exception) else exc


def replica_lost(exc: Exception) -> bool:
    """The call failed because the replica that took it (or one it called) died or
    cannot be reached: Serve's router has already taken it out of rotation."""
    return isinstance(raised_in_tier(exc), (ActorDiedError, ActorUnavailableError))


def callee_lost(exc: BaseException) -> bool:
    """A call failed because the replica that took it (or its engine) is gone, not
    for what it was asked: the same call may succeed on another replica."""
    if not isinstance(exc, Exception):
        return False
    cause = raised_in_tier(exc)
    # A step channel breaks when the replica at its other end dies.
    return replica_lost(exc) or isinstance(cause, (EngineLostError, ChannelClosedError))
