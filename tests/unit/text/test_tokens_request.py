"""What a text job asks the engine for: tokens, and no engine text unless stop strings need it."""

from __future__ import annotations

from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateRequest
from vllm.sampling_params import SamplingParams

from deployments.messages.tier import TextJob
from deployments.text.output import tokens_request


def job(**params: object) -> TextJob:
    request = GenerateRequest.model_validate(
        {"token_ids": [1, 2, 3], "output_mode": "text", "sampling_params": params}
    )
    return TextJob(generate_request=request, model_name="m")


def test_the_engine_does_not_detokenize_what_the_caller_detokenizes() -> None:
    original = job(max_tokens=16)
    request = tokens_request(original, stream=True)
    assert (request.output_mode, request.stream) == ("tokens", True)
    assert request.sampling_params.detokenize is False
    assert request.is_sampling_param_provided("max_tokens")
    assert request.sampling_params.max_tokens == 16
    # The job itself is not changed: a retry or the unary path reads it again.
    assert original.generate_request.sampling_params.detokenize is True


def test_stop_strings_keep_the_engine_detokenizing() -> None:
    """vLLM matches stop strings on the engine's own text."""
    request = tokens_request(job(stop=["Rome"]), stream=False)
    assert request.sampling_params.detokenize is True
    assert request.sampling_params.stop == ["Rome"]


def test_a_params_object_built_in_code_is_copied_not_changed() -> None:
    params = SamplingParams(max_tokens=8)
    request = GenerateRequest(token_ids=[1], sampling_params=params)
    tokens_request(TextJob(generate_request=request, model_name="m"), stream=True)
    assert params.detokenize is True
