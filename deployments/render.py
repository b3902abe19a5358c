"""Render deployment: chat template + tokenization on CPU, no engine.

A thin router over vLLM's ``ServingRender`` (and its ``ServingTokenization``), built by vLLM's own
``init_render_app_state`` as ``vllm launch render`` builds it, so a request
renders to the same ``GenerateRequest`` here as there.

Its Serve options, and the import path Serve loads this class by, are declared
in ``deployments/declarations/render.py``.
"""

from __future__ import annotations

import os

from starlette.datastructures import State
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateRequest
from vllm.entrypoints.serve.engine.protocol import ErrorResponse, ModelList
from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
from vllm.entrypoints.serve.tokenize.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)

from deployments.config.graph_config import GraphConfig
from deployments.edge.json_body import allow_deep_values
from deployments.vllm_adapter.engine_args import serve_namespace
from deployments.vllm_adapter.internals import APP_STATE_NAMES, checked_app_state


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
    """Chat/completion request → ``GenerateRequest``, and vLLM's tokenize/detokenize
    (errors come back as values)."""

    async def __init__(self, config: GraphConfig) -> None:  # type: ignore[misc]
        self._state = await build_render_state(config)

    async def render_chat(self, request: ChatCompletionRequest) -> GenerateRequest | ErrorResponse:
        try:
            return await self._state.serving_render.render_chat_request(request)
        except Exception as exc:  # vLLM raises some validation errors; keep them values
            return create_error_response(exc)

    async def render_completion(
        self, request: CompletionRequest
    ) -> list[GenerateRequest] | ErrorResponse:
        try:
            return await self._state.serving_render.render_completion_request(request)
        except Exception as exc:
            return create_error_response(exc)

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResponse | ErrorResponse:
        """vLLM's ``/tokenize``: a prompt, or chat messages through the template."""
        try:
            # vLLM reads only X-Request-Id from the HTTP request, for its logs.
            return await self._state.serving_tokenization.create_tokenize(request, None)
        except Exception as exc:
            return create_error_response(exc)

    async def detokenize(self, request: DetokenizeRequest) -> DetokenizeResponse | ErrorResponse:
        """vLLM's ``/detokenize``."""
        try:
            return await self._state.serving_tokenization.create_detokenize(request, None)
        except Exception as exc:
            return create_error_response(exc)

    async def models(self) -> ModelList:
        return await self._state.openai_serving_models.show_available_models()

    async def ready(self) -> bool:
        """The ingress's readiness probe: answers once __init__ has finished."""
        return True

    async def check_health(self) -> None:
        """Serve's health probe: the renderer must exist."""
        if getattr(self._state, "serving_render", None) is None:
            raise RuntimeError("render state is not initialised")
