"""vLLM's OpenAI Responses serving, reused across the graph's tiers: the one door to it.

vLLM's ``/v1/responses`` (``OpenAIServingResponses``) checks a request, renders its
input items, runs the engine, and turns the engine's outputs (``RequestOutput``s in a
``SimpleContext``) into a ``ResponsesResponse`` or the Responses stream events,
parsing reasoning and function calls with the same parser as chat. The graph runs
each step where it belongs: Render checks and renders (``ResponsesAdmission``), and
the tier that makes the text, Generate inline or the Derender tier, feeds the
outputs it rebuilt from the token stream to vLLM's own generators
(``ResponsesConversion``).

``OpenAIServingResponses.__init__`` wants an engine client, which neither tier has.
What the pieces used read of the instance is set here: the model config, the parser
class, the chat template settings, and vLLM's defaults for the switches ``vllm serve``
leaves off (no store, no request logging, no per-request metrics, no tool server).
``tests/unit/vllm_adapter/test_responses.py`` checks the pieces against vLLM's
behaviour, and ``tests/integration/test_responses_api.py`` the whole route against
vLLM's server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any

from vllm.entrypoints.generate.base.protocol import RequestResponseMetadata
from vllm.entrypoints.openai.responses.context import SimpleContext
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest, ResponsesResponse
from vllm.entrypoints.openai.responses.serving import OpenAIServingResponses
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.exceptions import GenerationError
from vllm.outputs import RequestOutput
from vllm.sampling_params import SamplingParams

from deployments.transport.coalesce import NoOutputEvent

if TYPE_CHECKING:
    from vllm.config import ModelConfig
    from vllm.renderers.online_derenderer import OnlineDerenderer
    from vllm.tokenizers import TokenizerLike


# The events vLLM's stream opens with, written before the engine's first output.
_OPENING = frozenset({"response.created", "response.in_progress"})


class _EngineFreeResponses(OpenAIServingResponses):
    """vLLM's Responses serving with what its checks and generators read, and no engine."""

    def __init__(self, model_config: ModelConfig, derenderer: OnlineDerenderer | None) -> None:
        # Not super().__init__: it needs an engine client. The parser class, the chat
        # template settings and the tools switch are the ones vLLM's server builds its
        # Responses serving with, which its render state's derenderer holds too.
        self.model_config = model_config
        self.use_harmony = model_config.hf_config.model_type == "gpt_oss"
        self.parser = derenderer.parser if derenderer is not None else None
        self.chat_template = derenderer.chat_template if derenderer is not None else None
        self.chat_template_content_format = (  # type: ignore[misc]
            derenderer.chat_template_content_format if derenderer is not None else "auto"
        )
        self.chat_template_kwargs = (
            derenderer.default_chat_template_kwargs if derenderer is not None else {}
        )
        self.enable_auto_tools = derenderer.enable_auto_tools if derenderer is not None else False
        self.return_tokens_as_token_ids = False
        self.enable_log_outputs = False
        self.request_logger = None
        self.enable_per_request_metrics = False
        self.tool_server = None
        # VLLM_ENABLE_RESPONSES_API_STORE unset: `store` is ignored and nothing is
        # kept, so every response id is unknown (docs/api.md).
        self.enable_store = False
        self.response_store = {}
        self.response_store_lock = asyncio.Lock()


class ResponsesAdmission:
    """vLLM's checks of a Responses request before it renders (Render's side)."""

    def __init__(self, model_config: ModelConfig) -> None:
        self._responses = _EngineFreeResponses(model_config, None)

    def refusal(self, request: ResponsesRequest) -> ErrorResponse | None:
        """What vLLM's ``/v1/responses`` refuses ``request`` with, if it does: its input
        checks, then ``previous_response_id``, which names no stored response (404).
        ``store`` is then turned off, as vLLM turns it off without its store switch."""
        if self._responses.use_harmony:
            return self._responses.create_error_response(
                "the graph serves the Responses API for models without harmony",
                param="model",
            )
        refused = self._responses._validate_create_responses_input(request)
        if refused is not None:
            return refused
        if request.previous_response_id is not None:
            return self.not_found(request.previous_response_id)
        request.store = False
        return None

    def not_found(self, response_id: str) -> ErrorResponse:
        """vLLM's answer for a response id it does not hold (retrieve, cancel, follow-up)."""
        return self._responses._make_not_found_error(response_id)


class ResponsesConversion:
    """Engine outputs → a Responses answer, by vLLM's own generators (the text tier's side)."""

    def __init__(self, derenderer: OnlineDerenderer) -> None:
        self._responses = _EngineFreeResponses(derenderer.model_config, derenderer)
        self._renderer = derenderer.renderer

    @property
    def _tokenizer(self) -> TokenizerLike:
        # Asked for per request: a tokens-only Generate replica has none, and builds
        # this without serving text.
        return self._renderer.get_tokenizer()

    def context(self, request: ResponsesRequest, prompt_token_ids: list[int]) -> SimpleContext:
        """The conversation context vLLM builds for a request without harmony."""
        responses = self._responses
        kwargs = responses._effective_chat_template_kwargs(request)
        parser = responses._make_response_parser(request, self._tokenizer, kwargs)
        if parser is not None:
            parser.set_prompt_token_ids(prompt_token_ids)
        return SimpleContext(response_parser=parser)

    async def response(
        self,
        request: ResponsesRequest,
        params: SamplingParams,
        model_name: str,
        context: SimpleContext,
        outputs: AsyncIterator[RequestOutput],
    ) -> ResponsesResponse | ErrorResponse:
        """The unary answer once ``outputs`` end (an engine error is vLLM's 500)."""
        arguments = self._arguments(request, params, model_name, context, outputs)
        try:
            return await self._responses.responses_full_generator(
                *arguments, created_time=int(time.time())
            )
        except (GenerationError, StreamFailed):
            # As vLLM's server answers the GenerationError its generator raises.
            error = GenerationError("Internal server error")
            return self._responses.create_error_response(
                str(error), err_type="InternalServerError", status_code=error.status_code
            )

    async def events(
        self,
        request: ResponsesRequest,
        params: SamplingParams,
        model_name: str,
        context: SimpleContext,
        outputs: AsyncIterator[RequestOutput],
    ) -> AsyncGenerator[str, None]:
        """The stream, each event written as vLLM's ``/v1/responses`` writes it."""
        arguments = self._arguments(request, params, model_name, context, outputs)
        events = self._responses.responses_stream_generator(
            *arguments, created_time=int(time.time())
        )
        async for event in events:
            written = responses_event(event)
            # vLLM writes these before it reads the engine's first output: they must
            # not start a coalescing window the first text would then wait out.
            yield NoOutputEvent(written) if event.type in _OPENING else written

    def _arguments(
        self,
        request: ResponsesRequest,
        params: SamplingParams,
        model_name: str,
        context: SimpleContext,
        outputs: AsyncIterator[RequestOutput],
    ) -> tuple[
        ResponsesRequest,
        SamplingParams,
        AsyncIterator[SimpleContext],
        SimpleContext,
        str,
        TokenizerLike,
        RequestResponseMetadata,
    ]:
        """What both of vLLM's generators take, in their order: the request, its
        sampling params, the context after each output, the context, the model name,
        the tokenizer, the request's metadata."""
        return (
            request,
            params,
            _appended(context, outputs),
            context,
            model_name,
            self._tokenizer,
            RequestResponseMetadata(request_id=request.request_id),
        )


class StreamFailed(Exception):
    """The generate stream under a Responses stream ended in an error (``error``: the
    error as vLLM's OpenAI routes send it). Raised through vLLM's generators, which
    handle only their own ``GenerationError``: on an engine error vLLM 0.32's
    ``/v1/responses`` validates ``{"error": …}`` as a stream event, which fails, and
    its stream breaks off with no event (docs/api.md)."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error.get("message"))
        self.error = error


def responses_event(event: Any) -> str:
    """One Responses stream event as vLLM's router writes it."""
    data = event.model_dump_json(indent=None, by_alias=True)
    return f"event: {getattr(event, 'type', 'unknown')}\ndata: {data}\n\n"


async def _appended(
    context: SimpleContext, outputs: AsyncIterator[RequestOutput]
) -> AsyncGenerator[SimpleContext, None]:
    """The context after each output, as vLLM's engine loop feeds it."""
    async for output in outputs:
        if output.outputs and output.outputs[0].finish_reason == "error":
            raise StreamFailed(_ENGINE_ERROR)
        context.append_output(output)
        yield context


# What vLLM's generate stream sends when its engine ends a request with an error.
_ENGINE_ERROR = {"message": "Internal server error", "type": "InternalServerError", "param": None}
