"""Render deployment: chat template + tokenization on CPU, no engine.

A thin router over vLLM's ``ServingRender`` (and its ``ServingTokenization``), built by vLLM's own
``init_render_app_state`` as ``vllm launch render`` builds it, so a request
renders to the same ``GenerateRequest`` here as there.

Its Serve options, and the import path Serve loads this class by, are declared
in ``deployments/declarations/render.py``.
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

from pydantic import TypeAdapter
from starlette.datastructures import State
from vllm.entrypoints.anthropic.protocol import (
    AnthropicCountTokensRequest,
    AnthropicMessagesRequest,
)
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateRequest
from vllm.entrypoints.serve.engine.protocol import ErrorResponse, ModelList
from vllm.entrypoints.serve.tokenize.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from vllm.version import __version__ as VLLM_VERSION

from deployments.config.graph_config import GraphConfig
from deployments.edge.bodies import json_of
from deployments.edge.errors import Refusal, bad_request
from deployments.edge.json_body import allow_deep_values
from deployments.edge.replies import answers_ingress, reply_of
from deployments.edge.validation import parse_body, validate
from deployments.messages.replies import RenderedText
from deployments.messages.tier import ParseContext, TextJob, prompt_texts
from deployments.observability.metrics import configure_metrics
from deployments.observability.tracing import configure_tracing, request_carrier
from deployments.scaling.cpu_load import CpuLoad
from deployments.transport.serve_internals import drop_access_log_lines
from deployments.vllm_adapter.anthropic import MessagesConversion, count_tokens_response
from deployments.vllm_adapter.engine_args import serve_namespace
from deployments.vllm_adapter.internals import APP_STATE_NAMES, checked_app_state
from deployments.vllm_adapter.responses import ResponsesAdmission

T = TypeVar("T")
# vLLM's completion server's answer to a streamed beam search.
STREAMED_BEAMS = "Streaming is not currently supported with beam search"
# ``/tokenize`` takes a prompt or chat messages: vLLM's union of the two.
_TOKENIZE = TypeAdapter(TokenizeRequest)


async def build_render_state(config: GraphConfig) -> State:
    """vLLM's render-server state (renderer, ServingRender, ServingDerender)."""
    from vllm import AsyncEngineArgs, envs
    from vllm.config import VllmConfig
    from vllm.entrypoints.launchers.render.app_state import init_render_app_state

    allow_deep_values()  # requests nested as deep as the edge lets through
    args = serve_namespace(config, role="render")
    engine_args = AsyncEngineArgs.from_cli_args(args)
    model_config = engine_args.create_model_config()
    # As `vllm launch render`: no kernels and no KV cache on a render server.
    model_config.quantization = None
    envs.VLLM_CPU_KVCACHE_SPACE = 0
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "0"
    vllm_config = VllmConfig(
        model_config=model_config,
        logging_config=engine_args.create_logging_config(),
        structured_outputs_config=engine_args.create_structured_outputs_config(),
    )
    state = State()
    await init_render_app_state(vllm_config, state, args)
    return checked_app_state(state, APP_STATE_NAMES)


class Render:
    """Chat/completion bodies → ``GenerateRequest``s, and vLLM's tokenize/detokenize.

    The Ingress passes each body on as the client sent it (it imports no vLLM):
    here it is parsed and validated with vLLM's models, once, and every answer
    goes back as a ``Reply`` (``edge/replies.py``), errors included.
    """

    async def __init__(self, config: GraphConfig) -> None:  # type: ignore[misc]
        configure_metrics(config.observability.metrics)
        configure_tracing(config.observability.otlp_traces_endpoint, "Render")
        if config.observability.access_log != "all":  # the Ingress's line per request only
            drop_access_log_lines()
        self._config = config
        self._parsers = {
            "reasoning_parser": config.reasoning_parser is not None,
            "tool_parser": config.tool_call_parser is not None,
        }
        self._load = CpuLoad()
        self._state = await build_render_state(config)
        self._messages = MessagesConversion(self._state.serving_render.online_renderer)
        self._responses = ResponsesAdmission(self._state.serving_render.model_config)

    async def _chat(self, request: ChatCompletionRequest) -> GenerateRequest:
        self._load.did(1)
        return _accepted(await self._state.serving_render.render_chat_request(request))

    async def _completion(
        self, request: CompletionRequest, *, served: bool = False
    ) -> list[GenerateRequest]:
        """``request`` rendered; ``served``: for ``/v1/completions``, where beam search
        is vLLM's completion server's, beside the engine (its render server refuses it)."""
        if served and request.use_beam_search:
            # Checked here as vLLM's completion server checks it, and rendered as any
            # request is (the server beside the engine renders it again).
            if request.stream:
                raise Refusal(bad_request(STREAMED_BEAMS))
            request = request.model_copy(update={"use_beam_search": False})
        rendered = _accepted(await self._state.serving_render.render_completion_request(request))
        self._load.did(len(rendered))
        return rendered

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's autoscaler asks: cores used, prompts rendered per second
        (``scaling/cpu_load.py``)."""
        return self._load.report()

    @answers_ingress
    async def chat_text(self, body: bytes, header_id: str | None) -> RenderedText:
        """``/v1/chat/completions``: the body rendered, as the job Generate
        (inline) or Derender (tier) turns into text."""
        request = parse_body(body, ChatCompletionRequest, header_id)
        job = TextJob(
            generate_request=await self._chat(request),
            chat_request=request,
            model_name=request.model or self._config.model_name,
        )
        return job.rendered(**self._parsers, trace=request_carrier())

    @answers_ingress
    async def completion_text(self, body: bytes, header_id: str | None) -> RenderedText:
        """``/v1/completions``: as ``chat_text``; a list of prompts (strings or token-id
        lists) is one job, answered as vLLM answers the batch (``TextJob.batch``)."""
        request = parse_body(body, CompletionRequest, header_id)
        rendered = await self._completion(request, served=True)
        job = TextJob(
            generate_request=rendered[0],
            completion_request=request,
            model_name=request.model or self._config.model_name,
            batch=rendered if len(rendered) > 1 else None,
            # vLLM's ids for a batch: ``cmpl-<id>-<i>`` per prompt, ``cmpl-<id>`` the answer's.
            response_id=f"cmpl-{request.request_id}" if len(rendered) > 1 else None,
            echoed_prompts=prompt_texts(request) if request.echo else None,
        )
        return job.rendered(**self._parsers, trace=request_carrier())

    async def _messages_chat(
        self,
        body: bytes,
        header_id: str | None,
        kind: type[AnthropicMessagesRequest] | type[AnthropicCountTokensRequest],
        *,
        served: bool,
    ) -> ChatCompletionRequest:
        """A Messages body as the chat request vLLM serves for it, named by its
        ``X-Request-Id`` as vLLM names the chat it runs."""
        chat = await self._messages.to_chat(parse_body(body, kind), served=served)
        if header_id:
            chat.request_id = header_id
        return chat

    @answers_ingress
    async def messages_text(self, body: bytes, header_id: str | None) -> RenderedText:
        """``/v1/messages``: served as the chat vLLM converts it to; the tier that
        makes its text converts the output back (``TextJob.api``)."""
        request = await self._messages_chat(body, header_id, AnthropicMessagesRequest, served=True)
        job = TextJob(
            generate_request=await self._chat(request),
            chat_request=request,
            model_name=request.model or self._config.model_name,
            api="anthropic",
        )
        return job.rendered(**self._parsers, trace=request_carrier())

    @answers_ingress
    async def count_message_tokens(self, body: bytes) -> dict[str, Any]:
        """``/v1/messages/count_tokens``: the prompt's tokens as ``/v1/messages`` renders it."""
        request = await self._messages_chat(body, None, AnthropicCountTokensRequest, served=True)
        rendered = await self._chat(request)
        return count_tokens_response(len(rendered.token_ids)).model_dump(exclude_none=True)

    @answers_ingress
    async def render_messages(self, body: bytes, header_id: str | None) -> dict[str, Any]:
        """``/v1/messages/render``: vLLM's render output for a Messages body."""
        request = await self._messages_chat(body, header_id, AnthropicMessagesRequest, served=False)
        return rendered_json(await self._chat(request))

    async def _responses_request(self, request: ResponsesRequest) -> GenerateRequest:
        self._load.did(1)
        return _accepted(await self._state.serving_render.render_responses_request(request))

    @answers_ingress
    async def responses_text(self, body: bytes) -> RenderedText:
        """``/v1/responses``: checked as vLLM's server checks it (no stored responses:
        ``previous_response_id`` is a 404 and ``store`` is ignored), rendered, and
        answered by the tier that makes its text as vLLM's Responses server answers."""
        request = parse_body(body, ResponsesRequest)
        refused = self._responses.refusal(request)
        if refused is not None:
            raise Refusal(reply_of(refused))
        job = TextJob(
            generate_request=await self._responses_request(request),
            responses_request=request,
            # vLLM's Responses answers name the served model, not the request's.
            model_name=self._config.model_name,
            api="responses",
        )
        return job.rendered(**self._parsers, trace=request_carrier())

    @answers_ingress
    async def unknown_response(self, response_id: str) -> dict[str, Any]:
        """Retrieving or cancelling a stored response: none is stored, as in vLLM
        without its store switch, so every id is vLLM's 404."""
        raise Refusal(reply_of(self._responses.not_found(response_id)))

    @answers_ingress
    async def render_responses(self, body: bytes) -> dict[str, Any]:
        """``/v1/responses/render``: vLLM's render output for a Responses body (stateless:
        ``previous_response_id`` is refused, as vLLM's render server refuses it)."""
        request = parse_body(body, ResponsesRequest)
        return rendered_json(await self._responses_request(request))

    @answers_ingress
    async def render_chat(self, body: bytes, header_id: str | None) -> dict[str, Any]:
        """``/v1/chat/completions/render``: vLLM's render output, plus ``parse_context``
        for ``output_mode: derender``."""
        request = parse_body(body, ChatCompletionRequest, header_id)
        rendered = await self._chat(request)
        return {**rendered_json(rendered), "parse_context": ParseContext.of(request).model_dump()}

    @answers_ingress
    async def render_completion(self, body: bytes, header_id: str | None) -> list[Any]:
        """``/v1/completions/render``: one rendered request per prompt."""
        request = parse_body(body, CompletionRequest, header_id)
        return [rendered_json(item) for item in await self._completion(request)]

    @answers_ingress
    async def tokenize(self, body: bytes) -> TokenizeResponse | ErrorResponse:
        """vLLM's ``/tokenize``: a prompt, or chat messages through the template."""
        request = validate(json_of(body), _TOKENIZE)
        # vLLM reads only X-Request-Id from the HTTP request, for its logs.
        return await self._state.serving_tokenization.create_tokenize(request, None)

    @answers_ingress
    async def detokenize(self, body: bytes) -> DetokenizeResponse | ErrorResponse:
        """vLLM's ``/detokenize``."""
        request = parse_body(body, DetokenizeRequest)
        return await self._state.serving_tokenization.create_detokenize(request, None)

    @answers_ingress
    async def models(self) -> ModelList:
        return await self._state.openai_serving_models.show_available_models()

    async def version(self) -> str:
        """The vLLM version serving the graph, for the Ingress's ``/version``."""
        return VLLM_VERSION

    async def ready(self) -> bool:
        """The ingress's readiness probe: answers once __init__ has finished."""
        return True

    async def check_health(self) -> None:
        """Serve's health probe: the renderer must exist."""
        if getattr(self._state, "serving_render", None) is None:
            raise RuntimeError("render state is not initialised")


def _accepted(rendered: T | ErrorResponse) -> T:
    """vLLM's render result, or its error value raised as the refusal the Ingress maps."""
    if isinstance(rendered, ErrorResponse):
        raise Refusal(reply_of(rendered))
    return rendered


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
