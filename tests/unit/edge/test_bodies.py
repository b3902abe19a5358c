"""Which media types the Ingress takes a JSON body under (vLLM's ``validate_json_request``)."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from deployments.edge.bodies import UNSUPPORTED_MEDIA_TYPE, require_json_media_type
from deployments.edge.errors import Refusal


def _request(content_type: str | None) -> Request:
    headers = [] if content_type is None else [(b"content-type", content_type.encode())]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": headers})


@pytest.mark.parametrize(
    "content_type", ["application/json", "Application/JSON", "application/json; charset=utf-8"]
)
def test_json_with_or_without_parameters_passes(content_type: str) -> None:
    require_json_media_type(_request(content_type))


@pytest.mark.parametrize(
    "content_type",
    [None, "", "text/plain", "application/x-www-form-urlencoded", "application/jsonx",
     "application/problem+json", " application/json"],
)  # fmt: skip
def test_any_other_media_type_is_vllms_400(content_type: str | None) -> None:
    with pytest.raises(Refusal) as refused:
        require_json_media_type(_request(content_type))
    assert refused.value.reply == UNSUPPORTED_MEDIA_TYPE
    assert refused.value.reply.status == 400
    assert refused.value.reply.body["error"]["type"] == "Bad Request"
