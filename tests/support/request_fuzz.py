"""A bounded, seeded request fuzzer over the sampling surface of the graph's HTTP API.

``cases(seed, count)`` draws requests for every route and output path of the
default app (chat and completions, inline and tier, streamed and not;
``/inference/v1/generate`` in ``tokens``, ``text`` and ``derender`` modes) and
for the tokens-only app, each with a random subset of the sampling knobs that
reach the engine: seeds, ``n``, logprobs and prompt logprobs, stop strings and
stop token ids, ``min_tokens`` / ``max_tokens`` extremes, ``logit_bias``,
``allowed_token_ids``, ``bad_words``, structured output (json schema, regex,
choice), very long prompts, tools with and without ``tool_choice``. Values
lean to the edges: token ids the model has but its tokenizer lacks, ids out of
range, zero and huge counts, prompts past the context.

Pure logic: what a case is and what counts as a clear answer
(``verdict``). ``tests/integration/test_request_fuzz.py`` sends them.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

MODEL_VOCAB = 1024  # models/tiny-chat/config.json vocab_size
TOKENIZER_VOCAB = 547  # ids the tokenizer knows (540 + 7 added tokens)
MAX_MODEL_LEN = 4096  # the integration graph's max_model_len
WORDS = ["two", "three", "plus", "what", "is", "the", "hi", "tool", "think", "weather"]
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TOOL_NAME = {"name": "get_weather"}
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}, "word": {"type": "string", "maxLength": 8}},
    "required": ["answer"],
}
ROUTES = (
    "chat-inline",
    "chat-tier",
    "completion-inline",
    "completion-tier",
    "generate-tokens",
    "generate-text",
    "generate-derender",
    "tokens-only-chat",
    "tokens-only-generate",
)
KNOBS = (
    "seed",
    "n",
    "logprobs",
    "prompt_logprobs",
    "stop",
    "stop_token_ids",
    "min_tokens",
    "max_tokens",
    "logit_bias",
    "allowed_token_ids",
    "bad_words",
    "json_schema",
    "regex",
    "choice",
    "long_prompt",
    "tools",
    "temperature",
    "penalties",
    "ignore_eos",
)


@dataclass(frozen=True)
class Case:
    number: int
    route: str
    path: str
    body: dict[str, Any]
    knobs: tuple[str, ...]
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    def describe(self) -> str:
        return (
            f"#{self.number} {self.route}{' stream' if self.stream else ''} {','.join(self.knobs)}"
        )


def cases(seed: int, count: int, api_key: str = "", tokens_only_prefix: str = "") -> list[Case]:
    """``count`` cases, the same for the same seed; every route and knob at least once
    when ``count`` ≥ ``len(ROUTES) * 4``."""
    rng = random.Random(seed)
    out = []
    for number in range(count):
        route = ROUTES[number % len(ROUTES)]
        # Every knob alone once early on; then random subsets of one to four.
        knobs = [KNOBS[number]] if number < len(KNOBS) else rng.sample(KNOBS, rng.randint(1, 4))
        out.append(_case(rng, number, route, sorted(knobs), api_key, tokens_only_prefix))
    return out


def _case(
    rng: random.Random, number: int, route: str, knobs: list[str], api_key: str, prefix: str
) -> Case:
    params: dict[str, Any] = {"max_tokens": rng.choice([1, 8, 24, 48])}
    for knob in knobs:
        params.update(_KNOB[knob](rng))
    stream = rng.random() < 0.5
    headers: dict[str, str] = {}
    if route.startswith("tokens-only"):
        headers["Authorization"] = f"Bearer {api_key}"
    long_prompt = params.pop("_long_prompt", None)
    tools = params.pop("_tools", None)
    if route in ("chat-inline", "chat-tier", "tokens-only-chat"):
        path = "/v1/chat/completions"
        body = _chat_body(rng, params, long_prompt, tools)
        headers["X-Text-Placement"] = "inline" if route == "chat-inline" else "tier"
    elif route.startswith("completion"):
        path = "/v1/completions"
        body = _completion_body(rng, params, long_prompt)
        headers["X-Text-Placement"] = route.removeprefix("completion-")
    else:
        path = "/inference/v1/generate"
        mode = {"tokens-only-generate": "tokens"}.get(route, route.removeprefix("generate-"))
        body = _generate_body(rng, params, long_prompt, mode)
    if route.startswith("tokens-only"):
        path = prefix + path
    body["stream"] = stream
    return Case(number, route, path, body, tuple(knobs), headers)


def _text(rng: random.Random, tokens: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(tokens))


def _chat_body(
    rng: random.Random, params: dict[str, Any], long_prompt: int | None, tools: Any
) -> dict[str, Any]:
    content = (
        _text(rng, long_prompt)
        if long_prompt
        else rng.choice(
            ["what is 2 plus 3?", "think: what is two plus three?", "weather in Paris?", "hi"]
        )
    )
    body: dict[str, Any] = {"messages": [{"role": "user", "content": content}], **params}
    if tools is not None:
        body.update(tools)
    # Chat names completion logprobs ``logprobs: true`` + ``top_logprobs``.
    if "logprobs" in body:
        top = body.pop("logprobs")
        body["logprobs"] = True
        body["top_logprobs"] = top
    _structured_as_chat(body)
    return body


def _completion_body(
    rng: random.Random, params: dict[str, Any], long_prompt: int | None
) -> dict[str, Any]:
    prompt = _text(rng, long_prompt) if long_prompt else _text(rng, rng.randint(1, 12))
    # Completions has no ``response_format``: structured output stays vLLM's own field.
    return {"prompt": prompt, **params}


def _structured_as_chat(body: dict[str, Any]) -> None:
    """OpenAI's ``response_format`` carries a JSON schema; vLLM's ``structured_outputs``
    the rest."""
    structured = body.get("structured_outputs")
    if structured and "json" in structured:
        schema = body.pop("structured_outputs")["json"]
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema},
        }


def _generate_body(
    rng: random.Random, params: dict[str, Any], long_prompt: int | None, mode: str
) -> dict[str, Any]:
    length = long_prompt or rng.randint(1, 16)
    # Ids the tokenizer lacks but the model has (547..1023) are fair game here.
    token_ids = [rng.randrange(MODEL_VOCAB) for _ in range(length)]
    sampling = {**params, "detokenize": mode != "tokens"}
    return {"token_ids": token_ids, "sampling_params": sampling, "output_mode": mode}


def _token(rng: random.Random) -> int:
    """A token id, mostly valid, sometimes one the tokenizer lacks or past the vocab."""
    return rng.choice(
        [
            rng.randrange(TOKENIZER_VOCAB),
            rng.randrange(TOKENIZER_VOCAB),
            rng.randrange(TOKENIZER_VOCAB, MODEL_VOCAB),
            rng.choice([MODEL_VOCAB, MODEL_VOCAB + 7, -1]),
        ]
    )


_KNOB: dict[str, Any] = {
    "seed": lambda r: {"seed": r.choice([0, 7, r.randrange(2**31), 2**63 - 1, -1])},
    "n": lambda r: {"n": r.choice([1, 2, 3, 0])},
    "logprobs": lambda r: {"logprobs": r.choice([0, 1, 5, 20, 21])},
    "prompt_logprobs": lambda r: {"prompt_logprobs": r.choice([0, 1, 5, -1])},
    "stop": lambda r: {"stop": r.choice([[r.choice(WORDS)], r.sample(WORDS, 3), "is", [""]])},
    "stop_token_ids": lambda r: {"stop_token_ids": [_token(r) for _ in range(r.randint(1, 3))]},
    "min_tokens": lambda r: {"min_tokens": r.choice([0, 4, 16, 10_000])},
    "max_tokens": lambda r: {
        "max_tokens": r.choice([1, 256, MAX_MODEL_LEN - 64, MAX_MODEL_LEN, 10**6, 0, -1])
    },
    "logit_bias": lambda r: {
        "logit_bias": {str(_token(r)): r.choice([-100, -5, 5, 100]) for _ in range(3)}
    },
    "allowed_token_ids": lambda r: {
        "allowed_token_ids": r.choice([[_token(r) for _ in range(4)], list(range(100, 300)), []])
    },
    "bad_words": lambda r: {"bad_words": [*r.sample(WORDS, r.randint(1, 3)), " is the"]},
    "json_schema": lambda r: {"structured_outputs": {"json": SCHEMA}},
    "regex": lambda r: {"structured_outputs": {"regex": r.choice([r"[0-9]{1,3}", r"(yes|no)"])}},
    "choice": lambda r: {"structured_outputs": {"choice": r.choice([["yes", "no"], ["5"]])}},
    "long_prompt": lambda r: {"_long_prompt": r.choice([1500, 3500, MAX_MODEL_LEN + 200])},
    "tools": lambda r: {
        "_tools": r.choice(
            [
                {"tools": [TOOL]},
                {"tools": [TOOL], "tool_choice": "auto"},
                {"tools": [TOOL], "tool_choice": "none"},
                {"tools": [TOOL], "tool_choice": "required"},
                {"tools": [TOOL], "tool_choice": {"type": "function", "function": TOOL_NAME}},
            ]
        )
    },
    "temperature": lambda r: {
        "temperature": r.choice([0.0, 1e-5, 0.7, 2.0, -0.5]),
        "top_p": r.choice([1.0, 0.5, 1e-3]),
        "top_k": r.choice([-1, 1, 50]),
    },
    "penalties": lambda r: {
        "repetition_penalty": r.choice([1.0, 1.3, 2.0]),
        "presence_penalty": r.choice([0.0, 1.5, -2.0]),
        "frequency_penalty": r.choice([0.0, 2.0, 3.0]),
    },
    "ignore_eos": lambda r: {"ignore_eos": True},
}
STRUCTURED = frozenset({"json_schema", "regex", "choice"})
# vLLM's answer when its engine ends a request with an error (finish_reason
# "error" → GenerationError → 500), as its own server sends it.
ENGINE_ENDED = {"message": "Internal server error", "type": "InternalServerError", "code": 500}


@dataclass
class Verdict:
    ok: bool
    status: int
    why: str = ""
    engine_ended: bool = False
    """vLLM's engine ended the request with an error (see ``engine_ended_ok``)."""


def engine_ended_ok(case: Case) -> bool:
    """Where vLLM 0.32's own engine ends a request with an error, not a crash.

    With a reasoning parser (the graph's qwen3), structured output is not
    enforced while the model thinks, and ``<tool_call>`` there ends reasoning
    implicitly *and* is fed to the grammar as its first token
    (``StructuredOutputManager._get_constraint_bounds`` / ``accept_tokens``):
    a json/regex/choice grammar rejects it and the scheduler finishes the
    request with ``FINISHED_ERROR`` ("grammar rejected tokens"). vLLM's server
    answers that 500; so does the graph. Nothing else may end that way.
    """
    return bool(STRUCTURED & set(case.knobs))


def verdict(case: Case, status: int, body: str) -> Verdict:
    """A 2xx whose body parses (a stream: every event, ending with ``[DONE]``, no 5xx
    error event), or a clear 4xx: vLLM's error shape with a message and the status.
    vLLM's "engine ended the request" 500 passes only where ``engine_ended_ok``."""
    if 400 <= status < 500:
        return _clear_error(status, body)
    if status == 500 and _error_of(body) == ENGINE_ENDED and engine_ended_ok(case):
        return Verdict(True, status, engine_ended=True)
    if not 200 <= status < 300:
        return Verdict(False, status, f"status {status}: {body[:300]}")
    if not case.stream:
        try:
            json.loads(body)
        except json.JSONDecodeError as exc:
            return Verdict(False, status, f"not JSON: {exc}: {body[:200]}")
        return Verdict(True, status)
    events = [line[len("data: ") :] for line in body.splitlines() if line.startswith("data: ")]
    if not events or events[-1] != "[DONE]":
        return Verdict(False, status, f"stream without [DONE]: {body[-300:]}")
    engine_ended = False
    for event in events[:-1]:
        try:
            payload = json.loads(event)
        except json.JSONDecodeError as exc:
            return Verdict(False, status, f"event not JSON: {exc}: {event[:200]}")
        error = payload.get("error") if isinstance(payload, dict) else None
        if error is None:
            continue
        if error.get("code") == 500 and _error_of(event) == ENGINE_ENDED and engine_ended_ok(case):
            engine_ended = True
        elif not isinstance(error.get("code"), int) or not 400 <= error["code"] < 500:
            return Verdict(False, status, f"error event: {event[:300]}")
    return Verdict(True, status, engine_ended=engine_ended)


def _error_of(body: str) -> dict[str, Any] | None:
    """The message, type and code of a body in vLLM's error shape."""
    try:
        error = json.loads(body)["error"]
        return {k: error[k] for k in ("message", "type", "code")}
    except (json.JSONDecodeError, KeyError, TypeError):
        return None


def _clear_error(status: int, body: str) -> Verdict:
    error = _error_of(body)
    if error is None:
        return Verdict(False, status, f"{status} not in vLLM's error shape: {body[:300]}")
    if not error["message"] or error["code"] != status:
        return Verdict(False, status, f"{status} without message or code: {body[:300]}")
    return Verdict(True, status)
