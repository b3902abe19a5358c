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


def json_of(body: bytes) -> Any:
    """``body`` parsed, if it is JSON a tier can take (``json_body``); else a
    ``Refusal`` with vLLM's 400."""
    try:
        return parse_json(body)
    except BadJson as exc:
        raise Refusal(bad_request(str(exc))) from None


async def read_json(raw: Request) -> Any:
    """The JSON body, whatever Content-Type the client sent."""
    return json_of(await raw.body())
