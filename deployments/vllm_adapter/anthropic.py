"""vLLM's Anthropic Messages serving, reused across the graph's tiers: the one door to it.

vLLM's ``/v1/messages`` (``AnthropicServingMessages``) converts a Messages request
into a chat request, serves the chat, and converts the chat output back into a
Messages response or Anthropic's stream events. The graph runs the same three steps
where they belong: Render converts the request (``MessagesConversion``), and the
tier that makes the chat text, Generate inline or the Derender tier, converts its
output (``anthropic_message``, ``anthropic_events``): one stateful stream
derenderer, and vLLM's own converter over what it writes.

``AnthropicServingMessages.__init__`` wants an engine client, which neither tier
has. The conversions read none of what it sets but the renderer (for the template
probes) and the model config, so the class is built here without it, with those
set. ``tests/unit/vllm_adapter/test_anthropic.py`` checks each piece used against
vLLM's behaviour, and ``tests/integration/test_messages_api.py`` the whole route
against vLLM's server.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING

from vllm.entrypoints.anthropic.protocol import (
    AnthropicContextManagement,
    AnthropicCountTokensRequest,
    AnthropicCountTokensResponse,
    AnthropicDisabledThinkingEffort,
    AnthropicMessagesRequest,
    AnthropicMessagesResponse,
)
from vllm.entrypoints.anthropic.serving import AnthropicServingMessages
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
)

if TYPE_CHECKING:
    from vllm.renderers.online_renderer import OnlineRenderer


class _EngineFreeMessages(AnthropicServingMessages):
    """vLLM's Messages serving with what its conversions read, and no engine."""

    def __init__(self, online_renderer: OnlineRenderer | None) -> None:
        # Not super().__init__ (OpenAIServingChat's): it needs an engine client.
        self.online_renderer = online_renderer  # type: ignore[assignment]
        if online_renderer is not None:
            self.model_config = online_renderer.model_config
            self._merge_inline_system = self._should_merge_inline_system(online_renderer)
        # "auto", as `vllm serve` defaults --anthropic-disabled-thinking-effort:
        # probed from the template on the first request that disables thinking.
        self._disabled_thinking_effort = None


class MessagesConversion:
    """Messages requests → chat requests, as vLLM converts them (Render's side)."""

    def __init__(self, online_renderer: OnlineRenderer) -> None:
        self._messages = _EngineFreeMessages(online_renderer)

    async def to_chat(
        self, request: AnthropicMessagesRequest | AnthropicCountTokensRequest, *, served: bool
    ) -> ChatCompletionRequest:
        """The chat request vLLM serves for ``request``: ``served`` as ``/v1/messages``
        and ``count_tokens`` convert it (``thinking: disabled`` as the template's probe
        says); otherwise as ``/v1/messages/render`` does (reasoning effort ``none``)."""
        effort: AnthropicDisabledThinkingEffort = "none"
        if served and request.thinking is not None and request.thinking.type == "disabled":
            effort = await self._messages._get_disabled_thinking_effort()
        chat = self._messages.to_chat_completion_request(
            request,
            merge_inline_system=self._messages._merge_inline_system,
            disabled_thinking_effort=effort,
        )
        if isinstance(request, AnthropicMessagesRequest):
            chat.mm_payload = request.mm_payload
        return chat


def count_tokens_response(input_tokens: int) -> AnthropicCountTokensResponse:
    """``/v1/messages/count_tokens``'s answer, as vLLM builds it."""
    return AnthropicCountTokensResponse(
        input_tokens=input_tokens,
        context_management=AnthropicContextManagement(original_input_tokens=input_tokens),
    )


# The output converters read nothing of the instance.
_CONVERTER = _EngineFreeMessages(None)


def anthropic_message(response: ChatCompletionResponse) -> AnthropicMessagesResponse:
    """A unary chat response as vLLM's ``/v1/messages`` answers it."""
    return _CONVERTER.messages_full_converter(response)


def anthropic_events(chat_events: AsyncIterator[str]) -> AsyncGenerator[str, None]:
    """A chat stream's SSE events (opening on the role chunk, ending in ``[DONE]``) as
    vLLM's ``/v1/messages`` streams them: ``message_start``, content blocks,
    ``message_delta``, ``message_stop``."""
    return _CONVERTER.message_stream_converter(chat_events)  # type: ignore[arg-type]
