"""The one door to vLLM 0.32's internals: what is private in vLLM, or copied from it.

The rest of the graph uses vLLM's public serving classes, protocol models and
parsers. What it needs beyond them goes through here, so a vLLM upgrade (0.33
brings ``output_mode: derender`` and ``parse_context`` of its own) is checked
in one place: ``tests/unit/vllm_adapter/test_internals.py`` has a test per symbol that
fails naming it, and ``tests/integration/test_parity_vllm.py`` reads the engine
request-id prefix from a vLLM server's answer.

vLLM is imported here once, at module level, so the per-token helpers below
cost one call each. The block hashing the prefix router needs is copied apart,
in ``block_hashing.py``, since the router runs in the Ingress, which imports no
vLLM.

Not routed through here: ``deployments/vllm_adapter/cpu_worker.py`` subclasses vLLM's CPU
model runner (``_sample``, ``_bookkeeping_sync``), which only a subclass can
do; its symbols are checked beside the others.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

from vllm.entrypoints.serve.exception_handling.handlers.validation import (
    _MAX_REPORTED_ERRORS,
    _format_error,
    clean_loc_for_param,
)
from vllm.entrypoints.serve.exception_handling.utils import sanitize_message
from vllm.renderers.online_derenderer import (
    _decode_params,
    _logprob_context_tail,
    _resolve_logprobs,
    _seed_stream_state,
)
from vllm.v1.core.kv_cache_utils import DEFAULT_NONE_HASH_SEED
from vllm.v1.engine.detokenizer import FastIncrementalDetokenizer, uses_fast_detokenizer

if TYPE_CHECKING:
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionLogProbs,
        ChatCompletionRequest,
    )
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateLogProbs
    from vllm.renderers.online_derenderer import DerenderStreamState, OnlineDerenderer
    from vllm.v1.engine import EngineCoreRequest


class VllmInternalsChanged(RuntimeError):
    """vLLM no longer has an internal this graph relies on (a vLLM upgrade)."""


# --- Engine request ids -----------------------------------------------------------

ENGINE_REQUEST_PREFIX = "generate-tokens-"
"""``ServingTokens.serve_tokens`` names its engine request
``f"generate-tokens-{request_id}"`` and answers with that id; aborts must use it."""


def engine_request_id(request_id: str) -> str:
    """The engine's name for a ``/inference/v1/generate`` request id (idempotent)."""
    if request_id.startswith(ENGINE_REQUEST_PREFIX):
        return request_id
    return ENGINE_REQUEST_PREFIX + request_id


def client_request_id(engine_id: str) -> str:
    """The id a client sent, from the engine's name for it."""
    return engine_id.removeprefix(ENGINE_REQUEST_PREFIX)


def live_request_ids(engine: Any) -> Mapping[str, Any]:
    """The requests an ``AsyncLLM`` holds now, by the id its caller gave
    (``output_processor.external_req_ids``: vLLM adds a suffix internally)."""
    try:
        ids: Mapping[str, Any] = engine.output_processor.external_req_ids
    except AttributeError as exc:
        raise VllmInternalsChanged(f"AsyncLLM.output_processor.external_req_ids: {exc}") from exc
    return ids


# --- Request validation errors, as vLLM's FastAPI handler words them --------------


def validation_message(errors: Sequence[Any]) -> tuple[str, str | None]:
    """``(message, param)`` for pydantic errors of a request body, as vLLM's
    ``validation_exception_handler`` writes them: at most ten errors, each input
    summarised (never the whole value echoed back), ``param`` the first error's
    location without pydantic's internal markers. ``loc`` starts with ``body``."""
    param = None
    if errors:
        loc = errors[0].get("loc") if isinstance(errors[0], dict) else None
        param = clean_loc_for_param(tuple(loc)) if loc else None
    if not errors:
        return "Validation error", param
    count = len(errors)
    label = "error" if count == 1 else "errors"
    reported = errors[:_MAX_REPORTED_ERRORS]
    message = f"{count} validation {label}:\n"
    message += "".join(f"  {_format_error(err)}\n" for err in reported)
    if count > len(reported):
        message += f"  ...and {count - len(reported)} more {label}\n"
    return sanitize_message(message.rstrip()), param


# --- App state: the serving objects vLLM's init_app_state builds -------------------

APP_STATE_NAMES = (
    "openai_serving_models",
    "serving_tokenization",
    "serving_render",
    "serving_derender",
    "online_derenderer",
)
"""What ``init_app_state`` and ``init_render_app_state`` both set on the app state."""
ENGINE_APP_STATE_NAMES = (*APP_STATE_NAMES, "serving_tokens", "openai_serving_completion")
"""… and what only ``init_app_state`` (with an engine) adds: the token server, and the
completion server that answers beam search (``EngineCalls.serve_completion``)."""


def checked_app_state(state: Any, names: Sequence[str]) -> Any:
    """``state`` once each of ``names`` is set on it, or a loud error naming what is not."""
    missing = [name for name in names if getattr(state, name, None) is None]
    if missing:
        raise VllmInternalsChanged(f"vLLM's app state has no {', '.join(missing)}")
    return state


# --- Incremental detokenization and logprobs (vllm.renderers.online_derenderer) ----


def decode_params(
    tokenizer: Any,
    request: ChatCompletionRequest | CompletionRequest | None,
    *,
    preserve_special: bool,
) -> tuple[bool, bool]:
    """``(skip_special_tokens, spaces_between_special_tokens)`` as the engine derives them."""
    return _decode_params(tokenizer, request, preserve_special=preserve_special)


def seed_stream_state(
    tokenizer: Any, prompt_token_ids: list[int] | None, *, skip_special_tokens: bool
) -> DerenderStreamState:
    """The decode state primed from the prompt's tail, as the engine primes its detokenizer."""
    return _seed_stream_state(tokenizer, prompt_token_ids, skip_special_tokens=skip_special_tokens)


def detokenize_delta(
    derenderer: OnlineDerenderer,
    tokenizer: Any,
    token_ids: list[int],
    state: DerenderStreamState,
    *,
    skip_special_tokens: bool,
    spaces_between_special_tokens: bool,
) -> tuple[str, DerenderStreamState]:
    """The text of ``token_ids`` after ``state``, and the state after them."""
    return derenderer._detokenize_delta(
        tokenizer,
        token_ids,
        state,
        skip_special_tokens=skip_special_tokens,
        spaces_between_special_tokens=spaces_between_special_tokens,
    )


class StreamDecoder:
    """One stream's text from its token ids, fed in order, as vLLM's engine decodes a
    request's output for ``vllm serve``: for a fast tokenizer, vLLM's
    ``FastIncrementalDetokenizer`` (the tokenizers library's ``DecodeStream``, primed
    with the prompt); otherwise vLLM's derender window (``_detokenize_delta``).

    The fast path is the engine's own, so a stream's text is what ``vllm serve``
    streams, its recovery from an invalid UTF-8 prefix included; and it is a step of
    Rust a token where the window borrows from vLLM's tokenizer pool at every token
    (``python -m bench.derender_cost``: 6–9 µs a token with the parser against 16–19).
    Only its ``decode_next`` runs: stop strings are the derenderer's
    (``text/stop_strings.py``), so it keeps no text of its own.
    """

    def __init__(
        self,
        derenderer: OnlineDerenderer,
        tokenizer: Any,
        prompt_token_ids: list[int] | None,
        *,
        skip_special_tokens: bool,
        spaces_between_special_tokens: bool,
        request_id: str,
    ) -> None:
        self._fast: FastIncrementalDetokenizer | None = None
        self._derenderer = derenderer
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._spaces_between = spaces_between_special_tokens
        if uses_fast_detokenizer(tokenizer):
            # What the detokenizer reads of an EngineCoreRequest; no stop strings.
            params = SimpleNamespace(
                stop=None,
                min_tokens=0,
                include_stop_str_in_output=False,
                skip_special_tokens=skip_special_tokens,
                spaces_between_special_tokens=spaces_between_special_tokens,
            )
            request = SimpleNamespace(
                request_id=request_id, prompt_token_ids=prompt_token_ids, sampling_params=params
            )
            self._fast = FastIncrementalDetokenizer(tokenizer, cast("EngineCoreRequest", request))
        else:
            self._state = seed_stream_state(
                tokenizer, prompt_token_ids, skip_special_tokens=skip_special_tokens
            )

    def decode(self, token_ids: list[int]) -> str:
        """The text ``token_ids`` add after every token fed before them."""
        if self._fast is not None:
            return "".join([self._fast.decode_next(token) for token in token_ids])
        text, self._state = detokenize_delta(
            self._derenderer,
            self._tokenizer,
            token_ids,
            self._state,
            skip_special_tokens=self._skip_special,
            spaces_between_special_tokens=self._spaces_between,
        )
        return text


def resolve_logprobs(
    logprobs: GenerateLogProbs, tokenizer: Any, context_token_ids: Sequence[int] = ()
) -> ChatCompletionLogProbs:
    """Generate's id logprobs in the OpenAI chat shape (token text and bytes filled)."""
    return _resolve_logprobs(logprobs, tokenizer, initial_context_token_ids=context_token_ids)


def logprob_context_tail(context_token_ids: list[int], delta_token_ids: list[int]) -> list[int]:
    """The logprob decode context carried past one more chunk."""
    return _logprob_context_tail(context_token_ids, delta_token_ids)


def chat_template_kwargs(derenderer: OnlineDerenderer, request: ChatCompletionRequest) -> Any:
    """The chat template kwargs vLLM hands a parser for ``request``."""
    return derenderer._resolve_chat_template_kwargs(request)


def derender_chat_stream_parsed(
    derenderer: OnlineDerenderer,
    model_name: str,
    chunk: Any,
    state: DerenderStreamState,
    request: ChatCompletionRequest,
    prompt_token_ids: list[int],
) -> tuple[Any, DerenderStreamState]:
    """vLLM's stateless per-chunk derender step with parsers (what its ``/derender``
    runs per chunk): the baseline ``bench.derender_cost`` measures."""
    parser = derenderer.parser
    if parser is None:
        raise ValueError("the parsed derender step needs a reasoning or tool parser")
    return derenderer._derender_chat_stream_parsed(
        parser,
        model_name,
        chunk,
        state,
        request,
        len(prompt_token_ids),
        prompt_token_ids,
    )


# --- Prefix-cache block hashing (vllm.v1.core.kv_cache_utils) ----------------------

NON_CRYPTO_HASH_ALGOS = frozenset({"xxhash", "xxhash_cbor"})
"""vLLM's hash algorithms whose root gets a random seed per process unless
``PYTHONHASHSEED`` is set (``kv_cache_utils._NON_CRYPTO_HASH_FUNCTIONS``, by name)."""


def default_none_hash_seed() -> str:
    """The seed of vLLM's root block hash when ``PYTHONHASHSEED`` is unset."""
    return DEFAULT_NONE_HASH_SEED
