"""vLLM's completion ``echo``: the prompt's text before each choice's.

vLLM's own completion server does it as it writes the answer (``OpenAIServingCompletion``);
its scale-out derender, which the graph's completion output runs on, does not.
Streamed, the prompt goes with each choice's first chunk.
"""

from __future__ import annotations

from vllm.entrypoints.openai.completion.protocol import CompletionRequest


def with_echo(request: CompletionRequest, prompt_text: str, text: str) -> str:
    """``text`` of a choice of ``request`` with its prompt echoed as vLLM echoes it: no
    prompt text where ``return_token_ids`` returns the prompt as ids, and the prompt
    alone where ``max_tokens`` is 0 (a prompt scored, nothing generated)."""
    prefix = "" if request.return_token_ids else prompt_text
    return prefix if request.max_tokens == 0 else prefix + text
