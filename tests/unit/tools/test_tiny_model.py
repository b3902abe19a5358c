"""The embedded model: rebuilt by its script to the shipped one, with the tokens parsers need."""

from __future__ import annotations

import sys

from transformers import AutoTokenizer

from bench.harness.servers import REPO, TINY_MODEL
from tests.support.background import background


def test_tokenizer_has_the_chat_and_parser_tokens() -> None:
    tokenizer = AutoTokenizer.from_pretrained(TINY_MODEL)
    vocab = tokenizer.get_vocab()
    for token in (
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
    ):
        assert token in vocab, token
        assert tokenizer.encode(token, add_special_tokens=False) == [vocab[token]]
    # Markup tokens survive skip_special_tokens, as in Qwen3; turn tokens do not.
    ids = tokenizer.encode("<think>x</think><|im_end|>", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<think>x</think>"


def test_chat_template_renders_tools_and_thinking_switch() -> None:
    tokenizer = AutoTokenizer.from_pretrained(TINY_MODEL)
    messages = [{"role": "user", "content": "What is the weather in Oslo?"}]
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    with_tools = tokenizer.apply_chat_template(
        messages, tools=[tool], tokenize=False, add_generation_prompt=True
    )
    assert "- get_weather(city)" in with_tools
    assert with_tools.endswith("<|im_start|>assistant\n")
    no_think = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert no_think.endswith("<think>\n\n</think>\n\n")


# A one-core training run of minutes: run beside the suite from its start.
REBUILD = background(
    "test_build_script_rebuilds_the_shipped_model",
    [sys.executable, "scripts/build_tiny_model.py", "--check"],
    REPO,
)


def test_build_script_rebuilds_the_shipped_model() -> None:
    """On this machine's CPU, whichever kernel path torch takes on it."""
    status, output = REBUILD.result(timeout_s=1800)
    assert status == 0, output
    assert "rebuild matches" in output
    for which in ("shipped", "rebuilt"):
        assert f"{which}: greedy replies reproduced 136/136" in output
