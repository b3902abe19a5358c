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
from pydantic import BaseModel, TypeAdapter, ValidationError
from ray import serve
from ray.serve.handle import DeploymentHandle
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
    DerenderChatRequestUnion,
    DerenderCompletionRequestUnion,
    GenerateRequest,
)
from vllm.entrypoints.serve.engine.protocol import ErrorResponse

from .config import GraphConfig
from .errors import bad_request, install_exception_handlers, to_http
from .protocol import ParseContext, ServedBy, TextJob

ModelT = TypeVar("ModelT", bound=BaseModel)
HEALTH_TIMEOUT_S = 5.0
PLACEMENT_HEADER = "X-Text-Placement"
SERVED_BY_HEADER = "X-Served-By"
_DERENDER_CHAT = TypeAdapter(DerenderChatRequestUnion)
_DERENDER_COMPLETION = TypeAdapter(DerenderCompletionRequestUnion)

app = FastAPI(title="scaleout-serve")
install_exception_handlers(app)


async def read_json(raw: Request) -> Any:
    """The JSON body, whatever Content-Type the client sent; an error value if not JSON."""
    try:
        return json.loads(await raw.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return bad_request(f"JSON decode error: {exc}")


def validate(data: Any, model: type[ModelT] | TypeAdapter[Any]) -> Any:
    """``data`` as ``model``, or a 400 error value naming the first bad field."""
    if isinstance(data, ErrorResponse):
        return data
    try:
        if isinstance(model, TypeAdapter):
            return model.validate_python(data)
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        param = ".".join(str(p) for p in errors[0]["loc"]) if errors else None
        return bad_request(str(exc), param=param)


async def parse_body(raw: Request, model: type[ModelT]) -> ModelT | ErrorResponse:
    """The JSON body as ``model``, or an error value."""
    result: ModelT | ErrorResponse = validate(await read_json(raw), model)
    return result


async def respond(items: Any, headers: dict[str, str] | None = None) -> Response:
    """One streamed handle call → HTTP.

    The first item is awaited before any status is sent, so an error that
    comes first (bad input, overload) is a real 4xx/5xx, not a 200 with a
    cut-off body. A unary call yields exactly one item.
    """
    first = await anext(items)
    if isinstance(first, ServedBy):
        headers = {**(headers or {}), SERVED_BY_HEADER: first.replica}
        first = await anext(items)
    if isinstance(first, ErrorResponse):
        return to_http(first, headers)
    if isinstance(first, BaseModel):
        return JSONResponse(first.model_dump(), headers=headers)

    async def events() -> AsyncIterator[str]:
        yield first
        async for event in items:
            yield event

    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)


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
        self,
        config: GraphConfig,
        render: DeploymentHandle,
        generate: DeploymentHandle,
        derender: DeploymentHandle,
    ) -> None:
        self._config = config
        self._render = render
        self._generate_unary = generate
        self._generate = generate.options(stream=True)
        self._derender_unary = derender
        self._derender = derender.options(stream=True)

    @app.get("/health")
    async def health(self) -> Response:
        """200 once every tier answers: a replica that is up but whose engine is not is 503."""
        try:
            for probe in (
                self._render.ready,
                self._generate_unary.ready,
                self._derender_unary.ready,
            ):
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
        """vLLM's render output, plus ``parse_context`` for ``output_mode: derender``."""
        request = await parse_body(raw, ChatCompletionRequest)
        if isinstance(request, ErrorResponse):
            return to_http(request)
        rendered = await self._render.render_chat.remote(_with_header_id(request, raw))
        if isinstance(rendered, ErrorResponse):
            return to_http(rendered)
        return JSONResponse(
            {**rendered.model_dump(), "parse_context": ParseContext.of(request).model_dump()}
        )

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
        """``tokens`` and ``text`` go to Generate; ``derender`` to the Derender tier."""
        data = await read_json(raw)
        if isinstance(data, ErrorResponse):
            return to_http(data)
        if not isinstance(data, dict):
            return to_http(bad_request("request body must be a JSON object"))
        context_data = data.pop("parse_context", None)
        if data.get("output_mode") != "derender":
            request = validate(data, GenerateRequest)
            if isinstance(request, ErrorResponse):
                return to_http(request)
            return await respond(self._generate.generate.remote(request))
        if self._config.tokens_only and self._config.text_placement == "inline":
            return to_http(bad_request("output_mode 'derender' needs the Derender tier"))
        request = validate({**data, "output_mode": "tokens"}, GenerateRequest)
        if isinstance(request, ErrorResponse):
            return to_http(request)
        if not request.sampling_params.detokenize:
            return to_http(
                bad_request("output_mode='derender' requires sampling_params.detokenize")
            )
        context = None if context_data is None else validate(context_data, ParseContext)
        if isinstance(context, ErrorResponse):
            return to_http(context)
        return await respond(self._derender.generate_derender.remote(request, context))

    @app.post("/v1/chat/completions/derender")
    async def derender_chat(self, raw: Request) -> Response:
        request = validate(await read_json(raw), _DERENDER_CHAT)
        if isinstance(request, ErrorResponse):
            return to_http(request)
        result = await self._derender_unary.derender_chat.remote(request)
        return (
            to_http(result)
            if isinstance(result, ErrorResponse)
            else JSONResponse(result.model_dump())
        )

    @app.post("/v1/completions/derender")
    async def derender_completion(self, raw: Request) -> Response:
        request = validate(await read_json(raw), _DERENDER_COMPLETION)
        if isinstance(request, ErrorResponse):
            return to_http(request)
        result = await self._derender_unary.derender_completion.remote(request)
        return (
            to_http(result)
            if isinstance(result, ErrorResponse)
            else JSONResponse(result.model_dump())
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(self, raw: Request) -> Response:
        request = await parse_body(raw, ChatCompletionRequest)
        if isinstance(request, ErrorResponse):
            return to_http(request)
        placement = self._placement(raw)
        if isinstance(placement, ErrorResponse):
            return to_http(placement)
        rendered = await self._render.render_chat.remote(_with_header_id(request, raw))
        if isinstance(rendered, ErrorResponse):
            return to_http(rendered)
        job = TextJob(
            generate_request=rendered,
            chat_request=request,
            model_name=request.model or self._config.model_name,
        )
        return await self._text(job, placement)

    @app.post("/v1/completions")
    async def completions(self, raw: Request) -> Response:
        request = await parse_body(raw, CompletionRequest)
        if isinstance(request, ErrorResponse):
            return to_http(request)
        placement = self._placement(raw)
        if isinstance(placement, ErrorResponse):
            return to_http(placement)
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
        return await self._text(job, placement)

    def _placement(self, raw: Request) -> str | ErrorResponse:
        placement = raw.headers.get(PLACEMENT_HEADER, self._config.text_placement).lower()
        if placement not in ("inline", "tier"):
            return bad_request(
                f"{PLACEMENT_HEADER} must be 'inline' or 'tier', got {placement!r}",
                param=PLACEMENT_HEADER,
            )
        if placement == "inline" and self._config.tokens_only:
            return bad_request(
                "inline text needs a tokenizer on Generate, but this graph runs tokens_only",
                param=PLACEMENT_HEADER,
            )
        return placement

    async def _text(self, job: TextJob, placement: str) -> Response:
        tier = self._derender if placement == "tier" else self._generate
        return await respond(tier.text.remote(job), headers={PLACEMENT_HEADER: placement})
