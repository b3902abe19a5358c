"""The replica's reasoning counter against vLLM's own count, on vLLM's real classes.

vLLM counts a chat's reasoning tokens with a parser built for that request
(its tokenizer, ``chat_template_kwargs`` and model config). The counter keeps
one counting parser per ``chat_template_kwargs`` across requests; its counts
must equal a fresh parser's whatever came before them.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from deployments.config.graph_config import GraphConfig
from deployments.render import build_render_state
from deployments.text.reasoning_count import ReasoningCounter

OUTPUTS = [
    "<think>\nThe user asks for 2 plus 3. 2 plus 3 is 5.\n</think>\n\nThe answer is 5.",
    "<think>\n\n</think>\n\nHello! How can I help you today?",
    "<think>\nstill thinking when the length ran out",
    "The answer is 5.",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
]
TEMPLATE_KWARGS: list[dict[str, Any]] = [{}, {"enable_thinking": False}, {"enable_thinking": True}]


def derenderer_of(args: dict[str, Any]) -> Any:
    return asyncio.run(build_render_state(GraphConfig.from_args(args))).online_derenderer


@pytest.fixture(scope="module")
def derenderer() -> Any:
    return derenderer_of({"reasoning_parser": "qwen3", "tool_call_parser": "hermes"})


def vllm_count(derenderer: Any, kwargs: dict[str, Any], token_ids: list[int]) -> int:
    """As vLLM's chat server counts: a parser built for the request."""
    parser = derenderer.parser(
        derenderer.renderer.get_tokenizer(),
        None,
        chat_template_kwargs=kwargs,
        model_config=derenderer.model_config,
    )
    return int(parser.count_reasoning_tokens(tuple(token_ids)))


def test_counts_equal_a_fresh_parsers_in_any_order(derenderer: Any) -> None:
    tokenizer = derenderer.renderer.get_tokenizer()
    cases = [
        (kwargs, tokenizer.encode(text, add_special_tokens=False))
        for kwargs in TEMPLATE_KWARGS
        for text in OUTPUTS
    ]
    want = [vllm_count(derenderer, kwargs, ids) for kwargs, ids in cases]
    assert any(want) and not all(want)  # the outputs tell reasoning apart
    # enable_thinking changes the grammar, so the kwargs change some counts.
    assert want[: len(OUTPUTS)] != want[len(OUTPUTS) : 2 * len(OUTPUTS)]
    counter = ReasoningCounter(derenderer)
    assert counter.counts
    for order in (cases, cases[::-1], cases[::2] + cases[1::2]):
        got = {id(ids): counter.count(kwargs, ids) for kwargs, ids in order}
        assert [got[id(ids)] for _, ids in cases] == want


def test_keeps_a_bounded_number_of_parsers(derenderer: Any) -> None:
    ids = derenderer.renderer.get_tokenizer().encode(OUTPUTS[0], add_special_tokens=False)
    want = vllm_count(derenderer, {}, ids)
    counter = ReasoningCounter(derenderer, kept=2)
    for i in range(5):
        assert counter.count({"enable_thinking": True, "turn": i}, ids) == want
    assert len(counter._parsers) == 2
    # kwargs with no JSON form are counted with a parser that is not kept
    assert counter.count({"enable_thinking": True, "at": object()}, ids) == want
    assert len(counter._parsers) == 2


def test_without_a_reasoning_parser_nothing_counts() -> None:
    counter = ReasoningCounter(derenderer_of({"tool_call_parser": "hermes"}))
    assert not counter.counts
    assert counter.count({}, [1, 2, 3]) == 0


class _NoTokenizer:
    def get_tokenizer(self) -> Any:
        raise ValueError("Tokenizer not available when `skip_tokenizer_init=True`")


def test_a_derenderer_without_tokenizer_or_parser_still_gets_a_counter() -> None:
    # A tokens-only Generate: its derenderer has neither (e2e topology G).
    derenderer: Any = SimpleNamespace(parser=None, renderer=_NoTokenizer(), model_config=None)
    counter = ReasoningCounter(derenderer)
    assert not counter.counts
    assert counter.count({}, [1, 2, 3]) == 0
