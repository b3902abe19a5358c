"""One test per vLLM internal the graph relies on (``deployments/vllm_adapter/internals.py``).

Each runs the symbol through the adapter, on the tiny model, and fails naming
the vLLM symbol if vLLM renamed, moved or changed it. The engine request-id
prefix is also read from a vLLM server's own answer
(``tests/integration/test_parity_vllm.py::test_engine_request_id_prefix_is_vllms``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
    GenerateLogProbs,
    GenerateTokensStreamResponse,
)
from vllm.sampling_params import SamplingParams

from bench.harness.servers import TINY_MODEL
from deployments.config.graph_config import GraphConfig
from deployments.render import build_render_state
from deployments.vllm_adapter import internals as vi
from deployments.vllm_adapter.engine_args import serve_namespace


@contextlib.contextmanager
def vllm_symbol(name: str) -> Iterator[None]:
    """Any failure inside names the vLLM symbol that no longer behaves as relied on."""
    try:
        yield
    except Exception as exc:
        raise AssertionError(f"vLLM internal {name} changed: {exc!r}") from exc


CHAT = {"model": str(TINY_MODEL), "messages": [{"role": "user", "content": "think: hi"}]}


@pytest.fixture(scope="module")
def state() -> Any:
    config = GraphConfig.from_args({"reasoning_parser": "qwen3", "tool_call_parser": "hermes"})
    return asyncio.run(build_render_state(config))


@pytest.fixture(scope="module")
def tokenizer(state: Any) -> Any:
    return state.online_derenderer.renderer.get_tokenizer()


def test_render_app_state_names(state: Any) -> None:
    with vllm_symbol("init_render_app_state's state names"):
        assert vi.checked_app_state(state, vi.APP_STATE_NAMES) is state


def test_engine_app_state_adds_serving_tokens(state: Any) -> None:
    """``init_app_state`` adds ``serving_tokens`` through ``init_scale_out_state``;
    run that on the render state (no engine is called while it is built)."""
    from starlette.datastructures import State
    from vllm.entrypoints.scale_out.factories import init_scale_out_state

    engine_state = State()
    for name in ("openai_serving_models", "online_renderer", "online_derenderer", "tool_server"):
        setattr(engine_state, name, getattr(state, name))
    args = serve_namespace(GraphConfig.from_args({}), role="generate")
    # What ServingTokens reads of its engine client while it is built.
    engine: Any = SimpleNamespace(
        model_config=state.vllm_config.model_config,
        vllm_config=state.vllm_config,
        renderer=state.online_renderer.renderer,
        input_processor=None,
    )
    with vllm_symbol("vllm.entrypoints.scale_out.factories.init_scale_out_state"):
        init_scale_out_state(engine_state, args, engine, request_logger=None)
        # The completion server comes from init_generate_state, which builds every OpenAI
        # server on a live engine: every Generate replica checks it as it starts, and
        # tests/integration/test_parity_vllm.py's beam search runs on it.
        added = set(vi.ENGINE_APP_STATE_NAMES) - set(vi.APP_STATE_NAMES)
        vi.checked_app_state(engine_state, sorted(added - {"openai_serving_completion"}))


def test_checked_app_state_names_what_is_missing() -> None:
    from starlette.datastructures import State

    with pytest.raises(vi.VllmInternalsChanged, match="serving_render"):
        vi.checked_app_state(State(), ("serving_render",))


def test_engine_request_ids() -> None:
    assert vi.engine_request_id("abc") == f"{vi.ENGINE_REQUEST_PREFIX}abc"
    assert vi.engine_request_id(vi.engine_request_id("abc")) == vi.engine_request_id("abc")
    assert vi.client_request_id(vi.engine_request_id("abc")) == "abc"


def test_output_processor_external_req_ids() -> None:
    from vllm.v1.engine.output_processor import OutputProcessor

    class Engine:
        output_processor = OutputProcessor(None, log_stats=False)

    with vllm_symbol("OutputProcessor.external_req_ids"):
        live = vi.live_request_ids(Engine())
        assert not live.get("x")
        add = inspect.signature(OutputProcessor.add_request)
        assert "request" in add.parameters


def test_decode_params(state: Any, tokenizer: Any) -> None:
    request = ChatCompletionRequest.model_validate(CHAT)
    with vllm_symbol("vllm.renderers.online_derenderer._decode_params"):
        # A parser needs the special tokens (<think>) in the text.
        assert vi.decode_params(tokenizer, request, preserve_special=True)[0] is False
        skip, spaces = vi.decode_params(tokenizer, request, preserve_special=False)
        assert (skip, spaces) == (request.skip_special_tokens, True)


def test_seed_stream_state_and_detokenize_delta(state: Any, tokenizer: Any) -> None:
    """Token by token from a seeded state, the text is the tokenizer's decode of all."""
    text = "Hello! How can I help you today?"
    ids = tokenizer.encode(text, add_special_tokens=False)
    prompt = tokenizer.encode("hi there", add_special_tokens=False)
    with vllm_symbol("_seed_stream_state / OnlineDerenderer._detokenize_delta"):
        detok = vi.seed_stream_state(tokenizer, prompt, skip_special_tokens=True)
        out = ""
        for token in ids:
            delta, detok = vi.detokenize_delta(
                state.online_derenderer,
                tokenizer,
                [token],
                detok,
                skip_special_tokens=True,
                spaces_between_special_tokens=True,
            )
            out += delta
        assert out == tokenizer.decode(ids)


class _NotFast:
    """The tokenizer as a tokenizer vLLM's engine would not decode with its fast
    detokenizer (not a ``TokenizersBackend``): every call goes to the real one."""

    def __init__(self, tokenizer: Any) -> None:
        self._inner = tokenizer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __len__(self) -> int:
        return len(self._inner)


@pytest.mark.parametrize("spaces_between", [True, False])
@pytest.mark.parametrize("fast", [True, False])
def test_stream_decoder_is_the_engines_detokenizer(
    state: Any, tokenizer: Any, fast: bool, spaces_between: bool
) -> None:
    """Fed token by token after a prompt, the text is the engine's: vLLM's
    ``FastIncrementalDetokenizer`` for this (fast) tokenizer, the derender window for
    any other; special tokens (``<|im_end|>``) kept, as a parser needs them, and a
    character split across tokens (the emoji, four here) written once it is whole."""
    text = "<think>\nHello! 😀 How can I help?\n</think>\n\nDone.<|im_end|>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    prompt = tokenizer.encode("hi there", add_special_tokens=False)
    with vllm_symbol("vllm.v1.engine.detokenizer.FastIncrementalDetokenizer"):
        assert vi.uses_fast_detokenizer(tokenizer)
        engine = vi.FastIncrementalDetokenizer(
            tokenizer,
            SimpleNamespace(  # type: ignore[arg-type]
                request_id="r",
                prompt_token_ids=prompt,
                sampling_params=SamplingParams(
                    skip_special_tokens=False, spaces_between_special_tokens=spaces_between
                ),
            ),
        )
        engine.update(ids, stop_terminated=False)
        decoder = vi.StreamDecoder(
            state.online_derenderer,
            tokenizer if fast else _NotFast(tokenizer),
            prompt,
            skip_special_tokens=False,
            spaces_between_special_tokens=spaces_between,
            request_id="r",
        )
        out = "".join(decoder.decode([token]) for token in ids)
        assert out == engine.get_next_output_text(finished=True, delta=False)
        assert out == tokenizer.decode(ids, skip_special_tokens=False)


def test_resolve_logprobs_and_context_tail(tokenizer: Any) -> None:
    ids = tokenizer.encode("Hello world", add_special_tokens=False)
    logprobs = GenerateLogProbs.model_validate(
        {
            "content": [
                {"token_id": t, "logprob": -0.5, "top_logprobs": [{"token_id": t, "logprob": -0.5}]}
                for t in ids
            ]
        }
    )
    with vllm_symbol("vllm.renderers.online_derenderer._resolve_logprobs"):
        resolved = vi.resolve_logprobs(logprobs, tokenizer)
        assert resolved.content is not None
        assert "".join(e.token for e in resolved.content) == "Hello world"
        assert resolved.content[0].top_logprobs[0].logprob == -0.5
    with vllm_symbol("vllm.renderers.online_derenderer._logprob_context_tail"):
        tail = vi.logprob_context_tail([1, 2], [3])
        assert tail[-3:] == [1, 2, 3]
        assert len(vi.logprob_context_tail(list(range(1000)), [1])) < 1001


def test_chat_template_kwargs(state: Any) -> None:
    request = ChatCompletionRequest.model_validate(
        {**CHAT, "chat_template_kwargs": {"enable_thinking": False}}
    )
    with vllm_symbol("OnlineDerenderer._resolve_chat_template_kwargs"):
        kwargs = vi.chat_template_kwargs(state.online_derenderer, request)
        assert kwargs["enable_thinking"] is False


def test_derender_chat_stream_parsed(state: Any, tokenizer: Any) -> None:
    from vllm.renderers.online_derenderer import DerenderStreamState

    request = ChatCompletionRequest.model_validate(CHAT)
    ids = tokenizer.encode("<think>\nok\n</think>\n\nDone.", add_special_tokens=False)
    chunk = GenerateTokensStreamResponse.model_validate(
        {"choices": [{"index": 0, "token_ids": ids, "finish_reason": "stop"}]}
    )
    with vllm_symbol("OnlineDerenderer._derender_chat_stream_parsed"):
        out, _ = vi.derender_chat_stream_parsed(
            state.online_derenderer, "m", chunk, DerenderStreamState(), request, [1, 2]
        )
        delta = out.choices[0].delta
        assert (delta.reasoning or "").strip() == "ok"
        assert (delta.content or "").strip() == "Done."


def test_block_hashing_seed_and_non_cryptographic_algorithms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils

    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    sha = get_hash_fn_by_name("sha256")
    with vllm_symbol("kv_cache_utils.DEFAULT_NONE_HASH_SEED / resolve_none_hash_seed"):
        assert kv_cache_utils.resolve_none_hash_seed(sha) == vi.default_none_hash_seed()
    with vllm_symbol("kv_cache_utils._NON_CRYPTO_HASH_FUNCTIONS"):
        named = {get_hash_fn_by_name(name) for name in vi.NON_CRYPTO_HASH_ALGOS}
        assert named == set(kv_cache_utils._NON_CRYPTO_HASH_FUNCTIONS)


@pytest.mark.parametrize("method", ["_sample", "_bookkeeping_sync"])
def test_cpu_model_runner_methods_cpu_worker_overrides(method: str) -> None:
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    with vllm_symbol(f"CPUModelRunner.{method}"):
        assert callable(getattr(CPUModelRunner, method))
    if method == "_sample":
        params = list(inspect.signature(CPUModelRunner._sample).parameters)
        assert params[:3] == ["self", "logits", "spec_decode_metadata"], params


@pytest.mark.parametrize(
    "body",
    [{"token_ids": [], "sampling_params": {}}, {"token_ids": ["a"] * 30, "sampling_params": {}}],
    ids=["one-error", "past-ten-errors"],
)
def test_validation_message_is_vllms_handlers(body: dict[str, Any]) -> None:
    """The message and param vLLM's own FastAPI validation handler writes for the same errors."""
    import json

    from fastapi.exceptions import RequestValidationError
    from pydantic import ValidationError
    from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateRequest
    from vllm.entrypoints.serve.exception_handling.handlers.validation import (
        validation_exception_handler,
    )

    with pytest.raises(ValidationError) as caught:
        GenerateRequest.model_validate(body)
    errors = [{**e, "loc": ("body", *e["loc"])} for e in caught.value.errors(include_url=False)]
    request = SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(args=SimpleNamespace(
        log_error_stack=False))), state=SimpleNamespace())  # fmt: skip
    with vllm_symbol("validation_exception_handler (_format_error, clean_loc_for_param)"):
        answer = asyncio.run(validation_exception_handler(request, RequestValidationError(errors)))  # type: ignore[arg-type]
        want = json.loads(bytes(answer.body))["error"]
        assert vi.validation_message(errors) == (want["message"], want["param"])
