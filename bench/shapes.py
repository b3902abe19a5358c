"""Request shapes of the seed's table: chat, tools, reasoning.

Output lengths come from the seed's ranges (chat 128–512, tools 64–256,
reasoning 2,048–8,192 tokens), multiplied by a length scale for a CPU engine,
and are fixed per request with ``max_tokens`` + ``ignore_eos``. Every draw is
seeded, so two topologies see the same requests in the same order.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

# The seed's output-token ranges, at scale 1.
OUTPUT_RANGES: dict[str, tuple[int, int]] = {
    "chat": (128, 512),
    "tools": (64, 256),
    "reasoning": (2048, 8192),
}
SHAPES = tuple(OUTPUT_RANGES)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TOPICS = ("the sea", "a mountain", "bread", "a clock", "rain", "a library", "trains", "salt")
CITIES = ("Paris", "Lima", "Osaka", "Nairobi", "Oslo", "Quito", "Hanoi", "Perth")


@dataclass(frozen=True)
class BenchRequest:
    """One request of a cell: the OpenAI chat body every client starts from."""

    index: int
    shape: str
    output_tokens: int
    body: dict[str, Any]


def output_range(shape: str, length_scale: float) -> tuple[int, int]:
    low, high = OUTPUT_RANGES[shape]
    return max(2, round(low * length_scale)), max(2, round(high * length_scale))


def make_requests(
    shape: str, count: int, *, model: str, length_scale: float, seed: int
) -> list[BenchRequest]:
    """``count`` seeded requests of ``shape``: greedy, fixed output length."""
    rng = random.Random(f"{seed}:{shape}")
    low, high = output_range(shape, length_scale)
    requests = []
    for index in range(count):
        tokens = rng.randint(low, high)
        requests.append(BenchRequest(index, shape, tokens, _body(shape, rng, model, tokens)))
    return requests


def _body(shape: str, rng: random.Random, model: str, tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0,
    }
    if shape == "tools":
        city = rng.choice(CITIES)
        body["messages"] = [{"role": "user", "content": f"What is the weather in {city}?"}]
        body["tools"] = [WEATHER_TOOL]
        body["tool_choice"] = "auto"
    elif shape == "reasoning":
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        body["messages"] = [{"role": "user", "content": f"think: what is {a} plus {b}?"}]
    else:
        body["messages"] = [
            {"role": "user", "content": f"Write a short story about {rng.choice(TOPICS)}."}
        ]
    return body
