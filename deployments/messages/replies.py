"""What crosses into the Ingress: plain values, no vLLM type.

The Ingress imports no vLLM (its replicas start in seconds and hold a few
hundred MB less), so nothing a tier sends it may unpickle into a vLLM class:

- ``Reply``: a unary answer or an error value, already the JSON body and the
  status HTTP will carry (the tier wrote it from vLLM's model, once);
- ``ServedBy``: the first item of a text stream, naming the replica that holds it;
- ``RenderedText``: a chat or completion request rendered for text output. The
  Ingress routes it by its tokens and passes the job on unopened;
- SSE event text (``str``) for the items of a stream.

The tiers' side (vLLM's models → these) is ``deployments/edge/replies.py``.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Literal


@dataclass(frozen=True, slots=True)
class Reply:
    """A tier's answer as HTTP will carry it: the status and the JSON body."""

    status: int
    body: Any

    @property
    def is_error(self) -> bool:
        return self.status >= HTTPStatus.BAD_REQUEST


def error_reply(
    message: str,
    err_type: str = "BadRequestError",
    status: HTTPStatus = HTTPStatus.BAD_REQUEST,
    param: str | None = None,
) -> Reply:
    """An error in vLLM's shape (``ErrorResponse``): ``{"error": {message, type, param, code}}``."""
    error = {"message": message, "type": err_type, "param": param, "code": status.value}
    return Reply(status.value, {"error": error})


@dataclass(frozen=True, slots=True)
class ServedBy:
    """First item of a text stream: which replica holds it (the stream is pinned there)."""

    placement: Literal["inline", "tier"]
    replica: str
    pid: int | None = None
    """Set only with ``GraphConfig.expose_replica_pid`` (tests)."""


def served_by(placement: Literal["inline", "tier"], *, with_pid: bool) -> ServedBy:
    from ray import serve

    replica = serve.get_replica_context().replica_id.unique_id
    return ServedBy(placement=placement, replica=replica, pid=os.getpid() if with_pid else None)


@dataclass(frozen=True, slots=True)
class RenderedText:
    """A request Render rendered for text output, on its way to Generate or Derender.

    ``job`` is the pickled ``TextJob`` (vLLM's request models): written once
    by Render, read once by the tier that generates or derenders it. The
    fields beside it are what the Ingress and Generate's router read.
    """

    token_ids: list[int]
    """The prompt, for Generate's prefix router."""
    cache_salt: str | None
    multimodal: bool
    """Multimodal features add block keys the router cannot make."""
    job: bytes
    request_id: str = ""
    """The request's id, for the Ingress's log lines."""
    expected_tokens: int | None = None
    """The most tokens it may generate, every prompt and choice together (None: up
    to the model's length): the text work ``text_placement: auto`` weighs."""
    parsed: bool = False
    """Whether its text runs a reasoning or tool parser on every token."""
    trace: dict[str, str] | None = None
    """The request's trace context (W3C headers) the tier that makes its text runs
    under: the Ingress's span (``observability/tracing.py``); None when not traced."""
    beside_engine: bool = False
    """Its text can only be made next to the engine, whatever the placement: vLLM's
    beam search calls the engine step by step, beam by beam."""

    def open(self) -> Any:
        """The ``TextJob`` (only a tier that imports vLLM may call this)."""
        return pickle.loads(self.job)


class TierFailure(RuntimeError):
    """A tier failed under a call from the Ingress (not a request's fault): its
    error, by type name and message, in a class the Ingress can unpickle."""
