"""Bodies the Ingress passed on, validated as vLLM validates them, in the tier
that owns the model (the Ingress imports no vLLM).

Each function returns the model or raises a ``Refusal`` with vLLM's 400; a
tier method that answers the Ingress turns it into its reply
(``replies.answers_ingress``).
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError
from vllm.entrypoints.serve.exception_handling.error_response import create_error_response

from deployments.edge.bodies import json_of
from deployments.edge.errors import Refusal
from deployments.edge.replies import reply_of
from deployments.vllm_adapter.internals import validation_message

ModelT = TypeVar("ModelT", bound=BaseModel)


def validate(data: Any, model: type[ModelT] | TypeAdapter[Any]) -> Any:
    """``data`` as ``model``; else a 400 naming the bad fields, worded as vLLM's."""
    try:
        if isinstance(model, TypeAdapter):
            return model.validate_python(data)
        return model.model_validate(data)
    except ValidationError as exc:
        # Located under ``body`` as FastAPI locates a body's errors for vLLM.
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        message, param = validation_message(errors)
        raise Refusal(
            reply_of(
                create_error_response(
                    message, HTTPStatus.BAD_REQUEST.phrase, HTTPStatus.BAD_REQUEST, param
                )
            )
        ) from None
    except Exception as exc:
        # vLLM's own validators raise VLLMValidationError & co.; vLLM maps them.
        raise Refusal(reply_of(create_error_response(exc))) from None


def parse_body(body: bytes, model: type[ModelT], header_id: str | None = None) -> ModelT:
    """A body as the client sent it, parsed and validated as ``model``, named by its
    ``X-Request-Id`` (``named_by_header``) if given."""
    result: ModelT = validate(named_by_header(json_of(body), header_id), model)
    return result


def named_by_header(body: Any, header_id: str | None) -> Any:
    """A body named by ``X-Request-Id``, as vLLM names a request by it
    (``_base_request_id``: generate, chat and completions), unless the body names
    itself.

    vLLM takes the header over the body, but Ray Serve's proxy sets the header
    on every request (the client's, or one it makes up), so a ``request_id``
    the client put in the body wins here.
    """
    if header_id and isinstance(body, dict) and "request_id" not in body:
        return {**body, "request_id": header_id}
    return body
