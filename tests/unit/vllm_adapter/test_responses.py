"""vLLM's Responses serving through its one door (``deployments/vllm_adapter/responses.py``),
built without an engine, on the tiny model's render state: each piece the graph uses
fails here, naming vLLM's symbol, if a vLLM upgrade changes what it reads or does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest, ResponsesResponse
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.renderers.online_derenderer import OnlineDerenderer

from bench.harness.servers import TINY_MODEL
from deployments.config.graph_config import GraphConfig
from deployments.render import build_render_state
from deployments.transport.coalesce import NoOutputEvent
from deployments.vllm_adapter.responses import (
    ResponsesAdmission,
    ResponsesConversion,
    StreamFailed,
)
from tests.unit.vllm_adapter.test_internals import vllm_symbol

MODEL = str(TINY_MODEL)
ANSWER = "<think>\n2 plus 3 is 5\n</think>\n\nThe answer is 5."


@pytest.fixture(scope="module")
def derenderer() -> OnlineDerenderer:
    config = GraphConfig.from_args({"reasoning_parser": "qwen3", "tool_call_parser": "hermes"})
    state = asyncio.run(build_render_state(config))
    return state.online_derenderer  # type: ignore[no-any-return]


def request(**fields: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": MODEL, "input": "hi", **fields})


def test_admission_refuses_as_vllm_does_and_turns_store_off(derenderer: OnlineDerenderer) -> None:
    admission = ResponsesAdmission(derenderer.model_config)
    with vllm_symbol("OpenAIServingResponses._validate_create_responses_input"):
        refused = admission.refusal(request(background=True, store=True))
    assert refused is not None and refused.error.code == 400
    assert refused.error.param == "background"
    with vllm_symbol("OpenAIServingResponses._make_not_found_error"):
        missing = admission.refusal(request(previous_response_id="resp_gone"))
    assert missing is not None and missing.error.code == 404
    assert missing.error.message == "Response with id 'resp_gone' not found."
    kept = request(store=True)
    assert admission.refusal(kept) is None
    assert kept.store is False  # vLLM ignores `store` without its store switch


def outputs(derenderer: OnlineDerenderer, text: str, finish: str = "stop") -> list[RequestOutput]:
    """``text`` as an engine would deliver it: one delta per token."""
    tokenizer = derenderer.renderer.get_tokenizer()
    ids = tokenizer.encode(text, add_special_tokens=False)
    made = []
    for i, token in enumerate(ids):
        last = i == len(ids) - 1
        made.append(
            RequestOutput(
                request_id="r",
                prompt=None,
                prompt_token_ids=[1, 2, 3],
                prompt_logprobs=None,
                outputs=[
                    CompletionOutput(
                        index=0,
                        text=tokenizer.decode([token]),
                        token_ids=[token],
                        cumulative_logprob=None,
                        logprobs=None,
                        finish_reason=finish if last else None,
                    )
                ],
                finished=last,
            )
        )
    return made


async def source(items: list[RequestOutput]) -> AsyncGenerator[RequestOutput, None]:
    for item in items:
        yield item


def test_outputs_become_vllms_response_with_reasoning_and_message(
    derenderer: OnlineDerenderer,
) -> None:
    conversion = ResponsesConversion(derenderer)
    req = request()
    with vllm_symbol("OpenAIServingResponses._make_response_parser, SimpleContext"):
        context = conversion.context(req, [1, 2, 3])
    params = req.to_sampling_params(64, {})
    with vllm_symbol("OpenAIServingResponses.responses_full_generator"):
        answer = asyncio.run(
            conversion.response(req, params, "m", context, source(outputs(derenderer, ANSWER)))
        )
    assert isinstance(answer, ResponsesResponse), answer
    kinds = [item.type for item in answer.output]
    assert kinds == ["reasoning", "message"], kinds
    # vLLM's qwen3 parser leaves the blank line after </think> in the content.
    assert answer.output[1].content[0].text == "\n\nThe answer is 5."  # type: ignore[union-attr]
    assert answer.usage is not None and answer.usage.input_tokens == 3
    assert answer.status == "completed" and answer.model == "m"


def test_the_stream_is_vllms_events_in_order(derenderer: OnlineDerenderer) -> None:
    conversion = ResponsesConversion(derenderer)
    req = request(stream=True)
    params = req.to_sampling_params(64, {})

    async def run() -> list[str]:
        context = conversion.context(req, [1, 2, 3])
        items = source(outputs(derenderer, ANSWER))
        return [event async for event in conversion.events(req, params, "m", context, items)]

    with vllm_symbol("OpenAIServingResponses.responses_stream_generator"):
        events = asyncio.run(run())
    names = [event.split("\n", 1)[0].removeprefix("event: ") for event in events]
    assert names[:2] == ["response.created", "response.in_progress"], names
    # Written before the engine's first output, they start no coalescing window.
    assert [isinstance(e, NoOutputEvent) for e in events[:3]] == [True, True, False]
    assert not any(isinstance(e, NoOutputEvent) for e in events[2:])
    assert names[-1] == "response.completed", names
    assert "response.reasoning_text.delta" in names and "response.output_text.delta" in names
    data = [json.loads(event.split("\ndata: ", 1)[1]) for event in events]
    assert [d["sequence_number"] for d in data] == list(range(len(data)))
    text = "".join(d["delta"] for d in data if d["type"] == "response.output_text.delta")
    assert text == "\n\nThe answer is 5."


def test_an_engine_error_is_vllms_500_unary_and_ends_a_stream(
    derenderer: OnlineDerenderer,
) -> None:
    conversion = ResponsesConversion(derenderer)
    req = request()
    params = req.to_sampling_params(64, {})
    failing = outputs(derenderer, "The answer", finish="error")
    answer = asyncio.run(
        conversion.response(req, params, "m", conversion.context(req, [1]), source(failing))
    )
    assert isinstance(answer, ErrorResponse)
    assert (answer.error.code, answer.error.type) == (500, "InternalServerError")

    async def run() -> list[str]:
        context = conversion.context(req, [1])
        return [e async for e in conversion.events(req, params, "m", context, source(failing))]

    with pytest.raises(StreamFailed):
        asyncio.run(run())
