"""A rendered request survives its JSON trip to generate (vLLM omits default fields)."""

from __future__ import annotations

import json

import pytest
from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateRequest
from vllm.sampling_params import SamplingParams

from deployments.render import rendered_json


def round_trip(request: GenerateRequest, dump: dict[str, object]) -> GenerateRequest:
    return GenerateRequest.model_validate(json.loads(json.dumps(dump)))


@pytest.mark.parametrize("max_tokens", [16, 17, 4000])
def test_max_tokens_reaches_generate_as_the_client_set_it(max_tokens: int) -> None:
    rendered = GenerateRequest(
        token_ids=[1, 2, 3], sampling_params=SamplingParams(max_tokens=max_tokens)
    )
    back = round_trip(rendered, rendered_json(rendered))
    assert back.is_sampling_param_provided("max_tokens")
    assert back.sampling_params.max_tokens == max_tokens


def test_plain_model_dump_loses_the_default_valued_max_tokens() -> None:
    """Why rendered_json exists: vLLM's own dump drops max_tokens=16."""
    rendered = GenerateRequest(token_ids=[1, 2, 3], sampling_params=SamplingParams(max_tokens=16))
    back = round_trip(rendered, rendered.model_dump())
    assert not back.is_sampling_param_provided("max_tokens")
