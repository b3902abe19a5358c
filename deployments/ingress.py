"""Ingress: the graph's one HTTP surface (FastAPI on Ray Serve).

Routes OpenAI and vLLM scale-out endpoints to the Render and Generate tiers
through streamed DeploymentHandles, never HTTP, and is the one layer that
turns error values into HTTP responses.

It imports no vLLM, so each replica starts in seconds and holds a few
hundred MB less: bodies go on to the tier that owns their vLLM model, as the
client sent them (Render parses and validates chat, completion and tokenize
bodies, once), and tiers answer with plain values (``messages/replies.py``).
It parses only what it routes by: ``/inference/v1/generate``'s ``output_mode``.

Its Serve options, and the import path Serve loads this class by, are declared
in ``deployments/declarations/ingress.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.config.graph_config import GraphConfig
from deployments.edge.bodies import json_bytes, read_json, read_json_of_any_type
from deployments.edge.errors import (
    Refusal,
    anthropic_shaped,
    bad_request,
    install_exception_handlers,
    not_found,
)
from deployments.edge.guard import GuardSettings, crossing_body_cap, install_guard
from deployments.edge.json_body import allow_deep_values
from deployments.edge.placement import PLACEMENT_HEADER, requested_placement
from deployments.edge.request_spans import install_request_spans
from deployments.edge.shared_call import SharedCall
from deployments.edge.text_calls import TextCalls
from deployments.edge.tier_calls import (
    anthropic_stream_error,
    call,
    responses_stream_error,
)
from deployments.observability.cluster_metrics import graph_families
from deployments.observability.metrics import configure_metrics
from deployments.observability.tracing import configure_tracing, request_trace_kwargs
from deployments.transport.serve_internals import on_this_process_data_plane
from deployments.vllm_adapter.engine_metrics import exposition

HEALTH_TIMEOUT_S = 5.0
# The open /health and /metrics: requests that arrive while one fan-out is in
# flight share it; none is reused after (a read right after an abort must see it).
OPEN_ROUTE_TTL_S = 0.0
REQUEST_ID_HEADER = "X-Request-Id"

app = FastAPI(title="scaleout-serve")
install_exception_handlers(app)
install_guard(app)
install_request_spans(app)


async def _awaited(response: Any) -> Any:
    return await response


async def _unary(raw: Request, method: DeploymentHandle) -> Response:
    """The body, as the client sent it, → one tier call (which validates it) → JSON."""
    return JSONResponse(await _body_call(raw, method, with_id=False))


async def _body_call(raw: Request, method: DeploymentHandle, with_id: bool = True) -> Any:
    """``method``'s answer for the body as the client sent it (and its ``X-Request-Id``,
    ``with_id``), called under the request's span (``observability/tracing.py``)."""
    args = (await json_bytes(raw), _header_id(raw)) if with_id else (await json_bytes(raw),)
    return await call(method.remote(*args, **request_trace_kwargs()), method)


def _header_id(raw: Request) -> str | None:
    """The ``X-Request-Id`` header, which the tier that validates the body applies
    as vLLM does (Render for chat and completions, Generate or Derender for generate)."""
    return raw.headers.get(REQUEST_ID_HEADER)


# What a route calls is defined above this line: ``serve.ingress`` freezes the app
# here (a cloudpickle copy), and the routes, not yet importable by name, are copied
# by value with the module's globals as they are now.
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
        render, generate, derender, control_plane = (
            on_this_process_data_plane(h) for h in (render, generate, derender, control_plane)
        )
        configure_metrics(config.observability.metrics)
        configure_tracing(config.observability.otlp_traces_endpoint, "Ingress")
        allow_deep_values()  # bodies nested as deep as vLLM takes must cross tiers
        api_key = config.api_key.get_secret_value() if config.api_key else None
        app.state.guard = GuardSettings(
            api_key=api_key,
            max_body_bytes=crossing_body_cap(config.max_body_bytes),
            body_timeout_s=config.body_timeout_s,
            max_body_reads_without_key=config.max_body_reads_without_key,
            slow_body_s=config.slow_body_s,
        )
        self._config = config
        self._control = control_plane
        self._render = render
        self._derender_unary = derender
        context = serve.get_replica_context()
        replica = context.replica_id.unique_id
        self._texts = TextCalls(config, generate, derender, control_plane, replica)
        self._app_name = context.app_name
        self._vllm_version: str | None = None
        self._health: SharedCall[Response] = SharedCall(OPEN_ROUTE_TTL_S)
        self._metrics: SharedCall[Response] = SharedCall(OPEN_ROUTE_TTL_S)

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
        """The vLLM version serving the graph, as vLLM's server answers it (Render's:
        this process imports no vLLM)."""
        if self._vllm_version is None:
            self._vllm_version = await call(self._render.version.remote(), self._render)
        return JSONResponse({"version": self._vllm_version})

    @app.get("/metrics")
    async def metrics(self) -> Response:
        """Every engine's vLLM metrics, labelled by replica (``engine_metrics``), and the
        graph's own from Ray's metrics agents (``observability/``); open, so concurrent
        scrapes share one fan-out (``shared_call``)."""
        return await self._metrics.get(self._read_metrics)

    async def _read_metrics(self) -> Response:
        states, graph = await asyncio.gather(
            call(self._control.engine_states.remote(), self._control),
            graph_families(self._app_name),
        )
        return PlainTextResponse(exposition(states, graph), media_type=CONTENT_TYPE_LATEST)

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
        body = await read_json_of_any_type(raw)
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
        return JSONResponse(await call(self._render.models.remote(), self._render))

    @app.post("/v1/chat/completions/render")
    async def render_chat(self, raw: Request) -> Response:
        """vLLM's render output, plus ``parse_context`` for ``output_mode: derender``."""
        return JSONResponse(await _body_call(raw, self._render.render_chat))

    @app.post("/v1/completions/render")
    async def render_completion(self, raw: Request) -> Response:
        return JSONResponse(await _body_call(raw, self._render.render_completion))

    @app.post("/v1/messages/render")
    async def render_messages(self, raw: Request) -> Response:
        """vLLM's render output for an Anthropic Messages body (errors in vLLM's
        OpenAI shape, as its render server answers them)."""
        return JSONResponse(await _body_call(raw, self._render.render_messages))

    @app.post("/v1/responses/render")
    async def render_responses(self, raw: Request) -> Response:
        return await _unary(raw, self._render.render_responses)

    @app.post("/v1/messages")
    async def messages(self, raw: Request) -> Response:
        """Anthropic Messages, served as the chat vLLM converts it to, in either
        placement; errors in Anthropic's shape, as vLLM's ``/v1/messages``."""
        return await anthropic_shaped(self._messages(raw))

    async def _messages(self, raw: Request) -> Response:
        placement = self._placement(raw)
        rendered = await _body_call(raw, self._render.messages_text)
        return await self._texts.text(rendered, placement, anthropic_stream_error)

    @app.post("/v1/responses")
    async def responses(self, raw: Request) -> Response:
        """OpenAI Responses, in either placement, as vLLM's ``/v1/responses`` answers
        without its store switch (docs/api.md)."""
        placement = self._placement(raw)
        rendered = await _body_call(raw, self._render.responses_text, with_id=False)
        return await self._texts.text(rendered, placement, responses_stream_error)

    @app.get("/v1/responses/{response_id}")
    async def retrieve_response(self, response_id: str) -> Response:
        """No response is stored: vLLM's 404 for every id."""
        return await self._unknown_response(response_id)

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(self, response_id: str) -> Response:
        """No response is stored: vLLM's 404 for every id."""
        return await self._unknown_response(response_id)

    async def _unknown_response(self, response_id: str) -> Response:
        answer = self._render.unknown_response.remote(response_id)
        return JSONResponse(await call(answer, self._render))

    @app.post("/v1/messages/count_tokens")
    async def count_message_tokens(self, raw: Request) -> Response:
        return await anthropic_shaped(_unary(raw, self._render.count_message_tokens))

    @app.post("/tokenize")
    async def tokenize(self, raw: Request) -> Response:
        """vLLM's ``/tokenize`` (``prompt`` or ``messages``), on the Render tier."""
        return await _unary(raw, self._render.tokenize)

    @app.post("/detokenize")
    async def detokenize(self, raw: Request) -> Response:
        """vLLM's ``/detokenize``, on the Render tier."""
        return await _unary(raw, self._render.detokenize)

    @app.post("/inference/v1/generate")
    async def generate(self, raw: Request) -> Response:
        """``tokens`` and ``text`` go to Generate; ``derender`` to the Derender tier
        (each validates the body)."""
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
        return await self._texts.generate(data, context_data, _header_id(raw))

    @app.post("/v1/chat/completions/derender")
    async def derender_chat(self, raw: Request) -> Response:
        return await _unary(raw, self._derender_unary.derender_chat)

    @app.post("/v1/completions/derender")
    async def derender_completion(self, raw: Request) -> Response:
        return await _unary(raw, self._derender_unary.derender_completion)

    @app.post("/v1/chat/completions")
    async def chat_completions(self, raw: Request) -> Response:
        placement = self._placement(raw)
        return await self._texts.text(await _body_call(raw, self._render.chat_text), placement)

    @app.post("/v1/completions")
    async def completions(self, raw: Request) -> Response:
        placement = self._placement(raw)
        rendered = await _body_call(raw, self._render.completion_text)
        return await self._texts.text(rendered, placement)

    def _placement(self, raw: Request) -> str:
        return requested_placement(raw.headers.get(PLACEMENT_HEADER), self._config)
