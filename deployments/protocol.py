"""Wire models between the graph's tiers.

Tiers exchange vLLM's own protocol models (``GenerateRequest``,
``ChatCompletionRequest``, ``ErrorResponse``, …) through DeploymentHandles;
this module adds only what vLLM has no model for. Errors travel as values
(``ErrorResponse``) and the ingress alone maps them to HTTP.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateRequest


class TextJob(BaseModel):
    """A rendered OpenAI request, ready to generate and derender into text."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    generate_request: GenerateRequest
    """What `/render` returned for the request; its `token_ids` seed detokenization."""
    chat_request: ChatCompletionRequest | None = None
    """The original chat request: tools, tool_choice, reasoning flags. Set for chat."""
    completion_request: CompletionRequest | None = None
    """The original completion request. Set for completions."""
    model_name: str
    """The model name echoed in responses (the request's `model`)."""
