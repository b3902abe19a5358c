"""Ingress: the graph's one HTTP surface (FastAPI on Ray Serve).

Routes OpenAI and vLLM scale-out endpoints to the Render and Generate tiers
through streamed DeploymentHandles, never HTTP, and is the one layer that
turns error values into HTTP responses.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from ray import serve
from ray.serve.handle import DeploymentHandle
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateRequest
from vllm.entrypoints.serve.engine.protocol import ErrorResponse

from .config import GraphConfig
from .errors import bad_request, install_exception_handlers, to_http
from .protocol import TextJob

ModelT = TypeVar("ModelT", bound=BaseModel)
HEALTH_TIMEOUT_S = 5.0

app = FastAPI(title="scaleout-serve")
install_exception_handlers(app)


async def parse_body(raw: Request, model: type[ModelT]) -> ModelT | ErrorResponse:
    """The JSON body as ``model``, whatever Content-Type the client sent."""
    try:
        data = json.loads(await raw.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return bad_request(f"JSON decode error: {exc}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        param = ".".join(str(p) for p in errors[0]["loc"]) if errors else None
        return bad_request(str(exc), param=param)


async def respond(items: Any) -> Response:
    """One streamed handle call → HTTP.

    The first item is awaited before any status is sent, so an error that
    comes first (bad input, overload) is a real 4xx/5xx, not a 200 with a
    cut-off body. A unary call yields exactly one item.
    """
    first = await anext(items)
    if isinstance(first, ErrorResponse):
        return to_http(first)
    if isinstance(first, BaseModel):
        return JSONResponse(first.model_dump())

    async def events() -> AsyncIterator[str]:
        yield first
        async for event in items:
            yield event

    return StreamingResponse(events(), media_type="text/event-stream")


async def _awaited(response: Any) -> Any:
    return await response


RequestT = TypeVar("RequestT", ChatCompletionRequest, CompletionRequest)


def _with_header_id(request: RequestT, raw: Request) -> RequestT:
    """vLLM takes the request id from ``X-Request-Id``, else the body, else a uuid.

    Ray Serve's proxy always sets ``X-Request-Id`` (the client's, or one it
    makes up), so a ``request_id`` the client put in the body wins here.
    """
    header = raw.headers.get("X-Request-Id")
    if header and "request_id" not in request.model_fields_set:
        request.request_id = header
    return request


@serve.deployment(
    name="Ingress",
    ray_actor_options={"num_cpus": 0.1},
    max_ongoing_requests=1000,
)
@serve.ingress(app)
class Ingress:
    def __init__(
        self, config: GraphConfig, render: DeploymentHandle, generate: DeploymentHandle
    ) -> None:
        self._config = config
        self._render = render
        self._generate_unary = generate
        self._generate = generate.options(stream=True)

    @app.get("/health")
    async def health(self) -> Response:
        """200 once every tier answers: a replica that is up but whose engine is not is 503."""
        try:
            for probe in (self._render.ready, self._generate_unary.ready):
                await asyncio.wait_for(_awaited(probe.remote()), HEALTH_TIMEOUT_S)
        except Exception:
            return Response(status_code=503)
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models(self) -> JSONResponse:
        listing = await self._render.models.remote()
        return JSONResponse(listing.model_dump())

    @app.post("/v1/chat/completions/render")
    async def render_chat(self, raw: Request) -> Response:
        request = await parse_body(raw, ChatCompletionRequest)
        if isinstance(request, ErrorResponse):
            return to_http(request)
        rendered = await self._render.render_chat.remote(_with_header_id(request, raw))
        if isinstance(rendered, ErrorResponse):
            return to_http(rendered)
        return JSONResponse(rendered.model_dump())

    @app.post("/v1/completions/render")
    async def render_completion(self, raw: Request) -> Response:
        request = await parse_body(raw, CompletionRequest)
        if isinstance(request, ErrorResponse):
            return to_http(request)
        rendered = await self._render.render_completion.remote(_with_header_id(request, raw))
        if isinstance(rendered, ErrorResponse):
            return to_http(rendered)
        return JSONResponse([item.model_dump() for item in rendered])

    @app.post("/inference/v1/generate")
    async def generate(self, raw: Request) -> Response:
        request = await parse_body(raw, GenerateRequest)
        if isinstance(request, ErrorResponse):
            return to_http(request)
        return await respond(self._generate.generate.remote(request))

    @app.post("/v1/chat/completions")
    async def chat_completions(self, raw: Request) -> Response:
        request = await parse_body(raw, ChatCompletionRequest)
        if isinstance(request, ErrorResponse):
            return to_http(request)
        rendered = await self._render.render_chat.remote(_with_header_id(request, raw))
        if isinstance(rendered, ErrorResponse):
            return to_http(rendered)
        job = TextJob(
            generate_request=rendered,
            chat_request=request,
            model_name=request.model or self._config.model_name,
        )
        return await respond(self._generate.text.remote(job))

    @app.post("/v1/completions")
    async def completions(self, raw: Request) -> Response:
        request = await parse_body(raw, CompletionRequest)
        if isinstance(request, ErrorResponse):
            return to_http(request)
        rendered = await self._render.render_completion.remote(_with_header_id(request, raw))
        if isinstance(rendered, ErrorResponse):
            return to_http(rendered)
        if len(rendered) != 1:
            return to_http(bad_request("one prompt per /v1/completions request is supported"))
        job = TextJob(
            generate_request=rendered[0],
            completion_request=request,
            model_name=request.model or self._config.model_name,
        )
        return await respond(self._generate.text.remote(job))
