"""Request bodies at the Ingress: JSON a tier can take, validated as vLLM validates it.

Each function returns what the route needs or raises a ``Refusal`` (``errors``)
with vLLM's 400, which the Ingress's handler answers.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, TypeAdapter, ValidationError
from vllm.entrypoints.serve.exception_handling.error_response import create_error_response

from deployments.edge.errors import Refusal, bad_request
from deployments.edge.json_body import BadJson, parse_json
from deployments.vllm_adapter.internals import validation_message

ModelT = TypeVar("ModelT", bound=BaseModel)


async def read_json(raw: Request) -> Any:
    """The JSON body, whatever Content-Type the client sent, if it is JSON a tier can
    take (``json_body``)."""
    try:
        return parse_json(await raw.body())
    except BadJson as exc:
        raise Refusal(bad_request(str(exc))) from None


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
            create_error_response(
                message, HTTPStatus.BAD_REQUEST.phrase, HTTPStatus.BAD_REQUEST, param
            )
        ) from None
    except Exception as exc:
        # vLLM's own validators raise VLLMValidationError & co.; vLLM maps them.
        raise Refusal(create_error_response(exc)) from None


async def parse_body(raw: Request, model: type[ModelT]) -> ModelT:
    """The JSON body as ``model``."""
    result: ModelT = validate(await read_json(raw), model)
    return result
