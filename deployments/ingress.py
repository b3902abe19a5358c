"""Ingress: the graph's one HTTP surface (FastAPI on Ray Serve).

Routes OpenAI and vLLM scale-out endpoints to the Render and Generate tiers
through streamed DeploymentHandles, never HTTP, and is the one layer that
turns error values into HTTP responses.

Its Serve options, and the import path Serve loads this class by, are declared
in ``deployments/declarations/ingress.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, TypeAdapter
from ray import serve
from ray.serve.handle import DeploymentHandle
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
    DerenderChatRequestUnion,
    DerenderCompletionRequestUnion,
    GenerateRequest,
)
from vllm.entrypoints.serve.tokenize.protocol import DetokenizeRequest, TokenizeRequest
from vllm.version import __version__ as VLLM_VERSION

from deployments.config.graph_config import GraphConfig
from deployments.edge.bodies import parse_body, read_json, validate
from deployments.edge.errors import Refusal, bad_request, install_exception_handlers, not_found
from deployments.edge.guard import GuardSettings, crossing_body_cap, install_guard
from deployments.edge.json_body import allow_deep_values
from deployments.edge.shared_call import SharedCall
from deployments.edge.tier_calls import call, respond
from deployments.messages.tier import ParseContext, TextJob
from deployments.transport.step_channel import ChannelStream, StepChannels
from deployments.vllm_adapter.engine_metrics import exposition

HEALTH_TIMEOUT_S = 5.0
# The open /health and /metrics: requests that arrive while one fan-out is in
# flight share it; none is reused after (a read right after an abort must see it).
OPEN_ROUTE_TTL_S = 0.0
PLACEMENT_HEADER = "X-Text-Placement"
_DERENDER_CHAT = TypeAdapter(DerenderChatRequestUnion)
_DERENDER_COMPLETION = TypeAdapter(DerenderCompletionRequestUnion)
_TOKENIZE = TypeAdapter(TokenizeRequest)

app = FastAPI(title="scaleout-serve")
install_exception_handlers(app)
install_guard(app)


async def _awaited(response: Any) -> Any:
    return await response


RequestT = TypeVar("RequestT", ChatCompletionRequest, CompletionRequest)


def rendered_json(rendered: GenerateRequest) -> dict[str, Any]:
    """A rendered request as JSON that generate reads back the same.

    ``SamplingParams`` serializes with ``omit_defaults``, so a client's
    ``max_tokens: 16`` (the dataclass default) vanishes from the JSON, and
    generate, seeing no ``max_tokens``, applies its server-side default: up
    to the context length. Write it whenever render resolved one.
    """
    data = rendered.model_dump()
    if rendered.sampling_params.max_tokens is not None:
        data["sampling_params"]["max_tokens"] = rendered.sampling_params.max_tokens
    return data


async def _unary(raw: Request, schema: Any, method: DeploymentHandle) -> Response:
    """Body validated as ``schema`` (a model or TypeAdapter) → one tier call → JSON."""
    request = validate(await read_json(raw), schema)
    answer: BaseModel = await call(method.remote(request), method)
    return JSONResponse(answer.model_dump())


ONE_PROMPT = "one prompt per /v1/completions request is supported"


def _prompt_count(request: CompletionRequest) -> int:
    """Prompts a completion request holds: a list of strings or of token-id lists is
    several; a string or one token-id list is one."""
    prompt = request.prompt
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        return len(prompt)
    return 1


def _with_header_id(request: RequestT, raw: Request) -> RequestT:
    """vLLM takes the request id from ``X-Request-Id``, else the body, else a uuid.

    Ray Serve's proxy always sets ``X-Request-Id`` (the client's, or one it
    makes up), so a ``request_id`` the client put in the body wins here.
    """
    header = raw.headers.get("X-Request-Id")
    if header and "request_id" not in request.model_fields_set:
        request.request_id = header
    return request


@serve.ingress(app)
class Ingress:
    def __init__(
        self,
        config: GraphConfig,
        render: DeploymentHandle,
        generate: DeploymentHandle,
        derender: DeploymentHandle,
        control_plane: DeploymentHandle,
    ) -> None:
        allow_deep_values()  # bodies nested as deep as vLLM takes must cross tiers
        api_key = config.api_key.get_secret_value() if config.api_key else None
        app.state.guard = GuardSettings(
            api_key=api_key,
            max_body_bytes=crossing_body_cap(config.max_body_bytes),
            body_timeout_s=config.body_timeout_s,
            max_body_reads_without_key=config.max_body_reads_without_key,
        )
        self._config = config
        self._control = control_plane
        self._render = render
        self._generate = generate.options(stream=True)
        self._derender_unary = derender
        self._derender = derender.options(stream=True)
        self._derender_channels = StepChannels(
            derender, serve.get_replica_context().replica_id.unique_id
        )
        self._health: SharedCall[Response] = SharedCall(OPEN_ROUTE_TTL_S)
        self._metrics: SharedCall[Response] = SharedCall(OPEN_ROUTE_TTL_S)
        # Abort calls in flight after a tier failed (held so they are not collected).
        self._cleanups: set[asyncio.Task[Any]] = set()

    @app.get("/health")
    async def health(self) -> Response:
        """200 once every tier can serve: Render answers, and Generate and Derender each
        have a replica whose engine or parsers are up (subscribed to the control plane).

        Not a call into Generate or Derender: a replica whose streams fill its
        ``max_ongoing_requests`` is busy, not unhealthy. Open, so concurrent polls
        share one check (``shared_call``).
        """
        return await self._health.get(self._check_health)

    async def _check_health(self) -> Response:
        try:
            await asyncio.wait_for(_awaited(self._render.ready.remote()), HEALTH_TIMEOUT_S)
            tiers = await asyncio.wait_for(
                _awaited(self._control.subscribed.remote()), HEALTH_TIMEOUT_S
            )
        except Exception:
            return Response(status_code=503)
        return Response(status_code=200 if all(tiers.values()) else 503)

    @app.get("/version")
    async def version(self) -> JSONResponse:
        """The vLLM version serving the graph, as vLLM's server answers it."""
        return JSONResponse({"version": VLLM_VERSION})

    @app.get("/metrics")
    async def metrics(self) -> Response:
        """Every engine's vLLM metrics, labelled by replica (``engine_metrics``); open,
        so concurrent scrapes share one fan-out (``shared_call``)."""
        return await self._metrics.get(self._read_metrics)

    async def _read_metrics(self) -> Response:
        states = await call(self._control.engine_states.remote(), self._control)
        return PlainTextResponse(exposition(states), media_type=CONTENT_TYPE_LATEST)

    @app.post("/inference/v1/abort_requests")
    async def abort_requests(self, raw: Request) -> Response:
        """vLLM's abort, fanned out to every Generate replica (needs the API key)."""
        return await self._abort(raw)

    @app.post("/abort_requests")
    async def legacy_abort_requests(self, raw: Request) -> Response:
        """vLLM's unauthenticated abort path: only on a tokens-only graph, as in vLLM."""
        if not self._config.tokens_only:
            raise Refusal(not_found("Not Found"))
        return await self._abort(raw)

    async def _abort(self, raw: Request) -> Response:
        body = await read_json(raw)
        ids = body.get("request_ids") if isinstance(body, dict) else None
        if ids is None:
            raise Refusal(bad_request("Missing 'request_ids' in request body"))
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise Refusal(bad_request("'request_ids' must be a list of strings"))
        await call(self._control.abort.remote(ids), self._control)
        # An empty 200, as vLLM: whether an id was live is no client's business
        # (ControlPlane logs the counts for the operator).
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models(self) -> Response:
        models: BaseModel = await call(self._render.models.remote(), self._render)
        return JSONResponse(models.model_dump())

    @app.post("/v1/chat/completions/render")
    async def render_chat(self, raw: Request) -> Response:
        """vLLM's render output, plus ``parse_context`` for ``output_mode: derender``."""
        request = await parse_body(raw, ChatCompletionRequest)
        rendered = await call(
            self._render.render_chat.remote(_with_header_id(request, raw)), self._render
        )
        return JSONResponse(
            {**rendered_json(rendered), "parse_context": ParseContext.of(request).model_dump()}
        )

    @app.post("/v1/completions/render")
    async def render_completion(self, raw: Request) -> Response:
        request = await parse_body(raw, CompletionRequest)
        rendered = await call(
            self._render.render_completion.remote(_with_header_id(request, raw)), self._render
        )
        return JSONResponse([rendered_json(item) for item in rendered])

    @app.post("/tokenize")
    async def tokenize(self, raw: Request) -> Response:
        """vLLM's ``/tokenize`` (``prompt`` or ``messages``), on the Render tier."""
        return await _unary(raw, _TOKENIZE, self._render.tokenize)

    @app.post("/detokenize")
    async def detokenize(self, raw: Request) -> Response:
        """vLLM's ``/detokenize``, on the Render tier."""
        return await _unary(raw, DetokenizeRequest, self._render.detokenize)

    @app.post("/inference/v1/generate")
    async def generate(self, raw: Request) -> Response:
        """``tokens`` and ``text`` go to Generate; ``derender`` to the Derender tier."""
        data = await read_json(raw)
        if not isinstance(data, dict):
            raise Refusal(bad_request("request body must be a JSON object"))
        context_data = data.pop("parse_context", None)
        if self._config.tokens_only and data.get("output_mode") in ("text", "derender"):
            raise Refusal(
                bad_request(
                    f"output_mode={data['output_mode']!r} needs a tokenizer on the generate "
                    "server, but this graph runs tokens_only; use output_mode='tokens'",
                    param="output_mode",
                )
            )
        if data.get("output_mode") != "derender":
            request = validate(data, GenerateRequest)
            # The Ingress's own call: ending it (client gone, failure) cancels it there.
            return await respond(lambda: self._generate.generate.remote(request), self._generate)
        request = validate({**data, "output_mode": "tokens"}, GenerateRequest)
        if not request.sampling_params.detokenize:
            raise Refusal(bad_request("output_mode='derender' requires sampling_params.detokenize"))
        context = None if context_data is None else validate(context_data, ParseContext)
        return await respond(
            lambda: self._derender_channels.call("generate_derender_on_channel", request, context),
            self._derender,
            on_failure=self._end_later,
        )

    @app.post("/v1/chat/completions/derender")
    async def derender_chat(self, raw: Request) -> Response:
        return await _unary(raw, _DERENDER_CHAT, self._derender_unary.derender_chat)

    @app.post("/v1/completions/derender")
    async def derender_completion(self, raw: Request) -> Response:
        return await _unary(raw, _DERENDER_COMPLETION, self._derender_unary.derender_completion)

    @app.post("/v1/chat/completions")
    async def chat_completions(self, raw: Request) -> Response:
        request = await parse_body(raw, ChatCompletionRequest)
        placement = self._placement(raw)
        rendered = await call(
            self._render.render_chat.remote(_with_header_id(request, raw)), self._render
        )
        job = TextJob(
            generate_request=rendered,
            chat_request=request,
            model_name=request.model or self._config.model_name,
        )
        return await self._text(job, placement)

    @app.post("/v1/completions")
    async def completions(self, raw: Request) -> Response:
        request = await parse_body(raw, CompletionRequest)
        placement = self._placement(raw)
        if _prompt_count(request) > 1:  # refused before Render spends anything on it
            raise Refusal(bad_request(ONE_PROMPT, param="prompt"))
        rendered = await call(
            self._render.render_completion.remote(_with_header_id(request, raw)), self._render
        )
        if len(rendered) != 1:
            raise Refusal(bad_request(ONE_PROMPT, param="prompt"))
        job = TextJob(
            generate_request=rendered[0],
            completion_request=request,
            model_name=request.model or self._config.model_name,
        )
        return await self._text(job, placement)

    def _placement(self, raw: Request) -> str:
        placement = raw.headers.get(PLACEMENT_HEADER, self._config.text_placement).lower()
        if placement not in ("inline", "tier"):
            raise Refusal(
                bad_request(
                    f"{PLACEMENT_HEADER} must be 'inline' or 'tier', got {placement!r}",
                    param=PLACEMENT_HEADER,
                )
            )
        if placement == "inline" and self._config.tokens_only:
            raise Refusal(
                bad_request(
                    "inline text needs a tokenizer on Generate, but this graph runs tokens_only",
                    param=PLACEMENT_HEADER,
                )
            )
        return placement

    async def _text(self, job: TextJob, placement: str) -> Response:
        headers = {PLACEMENT_HEADER: placement}
        if placement == "inline":
            return await respond(lambda: self._generate.text.remote(job), self._generate, headers)
        return await respond(
            lambda: self._derender_channels.call("text_on_channel", job),
            self._derender,
            headers,
            on_failure=self._end_later,
        )

    def _end_later(self, tier_call: ChannelStream) -> None:
        """End the Generate call made for ``tier_call``, in the background.

        A Derender replica that dies mid-stream cannot cancel its call to
        Generate, and Ray does not cancel an actor call whose caller died:
        the engine would run the request to its end for nobody. The call is
        named by its key, a uuid no client sees, not by the request id: another
        client's request may carry the same one.
        """
        ending = self._control.end_calls.remote([tier_call.key])
        task = asyncio.create_task(call(ending, self._control))
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)
