"""Request bodies at the Ingress: JSON a tier can take.

The Ingress parses only what it routes by (``/inference/v1/generate``'s
``output_mode``); chat, completion, tokenize and render bodies go on to
Render as the bytes the client sent. Validation against vLLM's request models
happens in the tier that owns them (``validation.py``): the Ingress imports no
vLLM.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request

from deployments.edge.errors import Refusal, bad_request
from deployments.edge.json_body import BadJson, parse_json
from deployments.messages.replies import error_reply

# vLLM's ``validate_json_request`` (a dependency of each route that takes a JSON
# body, abort excepted) refuses any other media type; its validation handler words it.
UNSUPPORTED_MEDIA_TYPE = error_reply(
    "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
    "Bad Request",
)


def json_of(body: bytes) -> Any:
    """``body`` parsed, if it is JSON a tier can take (``json_body``); else a
    ``Refusal`` with vLLM's 400."""
    try:
        return parse_json(body)
    except BadJson as exc:
        raise Refusal(bad_request(str(exc))) from None


def require_json_media_type(raw: Request) -> None:
    """A ``Refusal`` unless the request says its body is ``application/json``
    (parameters aside), as vLLM's routes do: a body sent as ``text/plain`` or a
    form is not taken for JSON."""
    media_type = raw.headers.get("content-type", "").lower().split(";", maxsplit=1)[0]
    if media_type != "application/json":
        raise Refusal(UNSUPPORTED_MEDIA_TYPE)


async def json_bytes(raw: Request) -> bytes:
    """The body as sent, once its media type is JSON (``require_json_media_type``)."""
    require_json_media_type(raw)
    return await raw.body()


async def read_json(raw: Request) -> Any:
    """The JSON body, once its media type is JSON."""
    return json_of(await json_bytes(raw))


async def read_json_of_any_type(raw: Request) -> Any:
    """The JSON body, whatever Content-Type the client sent (vLLM's abort routes)."""
    return json_of(await raw.body())
