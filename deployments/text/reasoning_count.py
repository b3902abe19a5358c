"""Reasoning tokens in a whole output, counted as vLLM counts a unary response.

A chat's usage counts reasoning tokens over its whole output with the reasoning
parser, as vLLM's unary chat does (a stream's final usage too, since the
stream parser's running count follows how tokens were chunked:
``stream_derenderer.py``). Counted that way, vLLM builds a reasoning parser,
whose ``count_reasoning_tokens`` outside a stream builds a second parser engine
and runs one pass over the text that resets the engine first. The two builds
cost several times the pass (0.25 ms against 0.03 for a short answer of the
embedded model), and a replica counts for every chat it serves. So each replica
keeps one counting parser per ``chat_template_kwargs`` (they can change the
grammar: qwen3's ``enable_thinking``); since every pass starts from a reset
engine, a count never depends on the one before.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from vllm.reasoning import ReasoningParser
from vllm.renderers.online_derenderer import OnlineDerenderer

KEPT_PARSERS = 32  # distinct chat_template_kwargs at once; the least recent goes first


class ReasoningCounter:
    """Counts reasoning tokens in whole outputs for one replica's derenderer."""

    def __init__(self, derenderer: OnlineDerenderer, kept: int = KEPT_PARSERS) -> None:
        parser = derenderer.parser
        self._cls = parser.reasoning_parser_cls if parser is not None else None
        # Asked for only when a count needs a parser: a tokens-only Generate has none.
        self._derenderer = derenderer
        self._kept = kept
        self._parsers: OrderedDict[str, ReasoningParser] = OrderedDict()

    @property
    def counts(self) -> bool:
        """A reasoning parser runs, so usage reports reasoning tokens."""
        return self._cls is not None

    def count(self, template_kwargs: Mapping[str, Any], token_ids: Sequence[int]) -> int:
        if self._cls is None or not token_ids:
            return 0
        return self._parser(template_kwargs).count_reasoning_tokens(tuple(token_ids))

    def _parser(self, template_kwargs: Mapping[str, Any]) -> ReasoningParser:
        try:
            key = json.dumps(template_kwargs, sort_keys=True)
        except (TypeError, ValueError, RecursionError):
            return self._new(template_kwargs)  # no stable key: not kept
        parser = self._parsers.pop(key, None) or self._new(template_kwargs)
        self._parsers[key] = parser
        while len(self._parsers) > self._kept:
            self._parsers.popitem(last=False)
        return parser

    def _new(self, template_kwargs: Mapping[str, Any]) -> ReasoningParser:
        assert self._cls is not None
        # As vLLM's Parser builds its reasoning parser (vllm/parser/abstract_parser.py).
        return self._cls(
            self._derenderer.renderer.get_tokenizer(),
            model_config=self._derenderer.model_config,
            chat_template_kwargs=dict(template_kwargs),
        )
