"""Hostile and careless inputs get vLLM's status, never a 5xx: vLLM's own server is the oracle.

Each case goes to vLLM's OpenAI server (same model, parsers and context) and to
the graph; the statuses must be equal, and the graph's must not be a 5xx.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from bench.harness.servers import Server
from tests.integration.conftest import MODEL

DEEP = 5000
"""Deeper than either server's JSON parser takes."""
VALID_DEEP = 700
WORDS_5MIB = (5 << 20) // 3
"""Deep, but within what vLLM's parser takes; the template ignores the value."""


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def _chat(**extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        **extra,
    }


# (path, what, body: bytes as sent)
CASES: list[tuple[str, str, bytes]] = [
    ("/v1/chat/completions", "nested 5000 deep", b"[" * DEEP + b"]" * DEEP),
    ("/tokenize", "nested 5000 deep", b"[" * DEEP + b"]" * DEEP),
    ("/inference/v1/generate", "nested 5000 deep", b"[" * DEEP + b"]" * DEEP),
    ("/v1/chat/completions", "lone surrogate model", b'{"model": "\\ud800", "messages": []}'),
    ("/tokenize", "lone surrogate prompt", b'{"prompt": "a\\udc00"}'),
    (
        "/v1/chat/completions",
        "valid surrogate pair",
        json.dumps(_chat(messages=[{"role": "user", "content": "\U0001f600"}])).encode(),
    ),
    (
        "/v1/chat/completions",
        "700-deep chat_template_kwargs",
        json.dumps(_chat(chat_template_kwargs={"unused": _nested(VALID_DEEP)})).encode(),
    ),
    (
        "/v1/chat/completions",
        "5 MiB prompt (over the context)",
        json.dumps(_chat(messages=[{"role": "user", "content": "hi " * WORDS_5MIB}])).encode(),
    ),
    ("/tokenize", "3 MiB prompt", json.dumps({"model": MODEL, "prompt": "hi " * 2**20}).encode()),
    (
        "/inference/v1/abort_requests",
        "450k ids",
        json.dumps({"request_ids": [f"id-{i}" for i in range(450_000)]}).encode(),
    ),
]  # fmt: skip


@pytest.mark.parametrize(("path", "what", "body"), CASES, ids=[f"{p} {w}" for p, w, _ in CASES])
def test_hostile_input_gets_vllms_status(
    vllm_server: Server, client: httpx.Client, path: str, what: str, body: bytes
) -> None:
    headers = {"Content-Type": "application/json"}
    with httpx.Client(base_url=vllm_server.base_url, timeout=120) as reference:
        want = reference.post(path, content=body, headers=headers)
    got = client.post(path, content=body, headers=headers)
    assert got.status_code < 500, (what, got.status_code, got.text[:500])
    assert got.status_code == want.status_code, (what, got.text[:300], want.text[:300])
    if got.status_code >= 400:
        error = got.json()["error"]
        assert error["code"] == got.status_code and "Traceback" not in error["message"]


WORDED = [
    ("/inference/v1/generate", {"token_ids": [], "sampling_params": {}}),
    ("/inference/v1/generate", {"token_ids": ["a"] * 50, "sampling_params": {}}),
    ("/v1/chat/completions", {"model": MODEL, "messages": 3}),
]


@pytest.mark.parametrize(("path", "body"), WORDED, ids=["empty-ids", "many-bad-ids", "messages"])
def test_validation_errors_are_worded_as_vllms(
    vllm_server: Server, client: httpx.Client, path: str, body: dict[str, Any]
) -> None:
    """Status, type, param and message: at most ten errors, inputs summarised, not echoed."""
    with httpx.Client(base_url=vllm_server.base_url, timeout=120) as reference:
        want = reference.post(path, json=body)
    got = client.post(path, json=body)
    assert want.status_code == 400, want.text
    assert got.status_code == 400 and got.json() == want.json(), (got.text, want.text)


# A valid body for each route vLLM guards with ``validate_json_request``, and for
# its abort route, which takes any media type. (``output_mode: "derender"`` is the
# graph's own; the Ingress checks the media type before it reads the mode.)
_GENERATE = {"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 2}}
_MESSAGES = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
MEDIA_TYPE_ROUTES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", _chat()),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2}),
    ("/v1/chat/completions/render", _chat()),
    ("/v1/completions/render", {"model": MODEL, "prompt": "hi"}),
    ("/tokenize", {"model": MODEL, "prompt": "hi"}),
    ("/detokenize", {"model": MODEL, "tokens": [1, 2]}),
    ("/inference/v1/generate", _GENERATE),
    ("/v1/chat/completions/derender", {"chat_request": _chat()}),
    ("/v1/completions/derender", {"generate_responses": []}),
    ("/inference/v1/abort_requests", {"request_ids": ["nobody"]}),
    ("/v1/messages", {**_MESSAGES, "max_tokens": 2}),
    ("/v1/messages/count_tokens", _MESSAGES),
    ("/v1/messages/render", {**_MESSAGES, "max_tokens": 2}),
    ("/v1/responses/render", {"model": MODEL, "input": "hi"}),
    ("/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 2}),
]
MEDIA_TYPES = [
    None,
    "text/plain",
    "application/x-www-form-urlencoded",
    "application/json; charset=utf-8",
]


@pytest.mark.parametrize("media_type", MEDIA_TYPES, ids=[str(m) for m in MEDIA_TYPES])
def test_a_body_sent_as_another_media_type_is_answered_as_vllm_answers_it(
    vllm_server: Server, client: httpx.Client, media_type: str | None
) -> None:
    """A JSON body labelled text/plain, a form, or nothing: vLLM's 400 "Unsupported
    Media Type" (status and body) on each route it guards, its answer on abort."""
    headers = {"Content-Type": media_type} if media_type else {}
    got_any_refusal = False
    with httpx.Client(base_url=vllm_server.base_url, timeout=120) as reference:
        for path, body in MEDIA_TYPE_ROUTES:
            content = json.dumps(body).encode()
            want = reference.post(path, content=content, headers=headers)
            got = client.post(path, content=content, headers=headers)
            assert got.status_code == want.status_code, (path, got.text[:300], want.text[:300])
            if want.status_code == 400 and "Media Type" in want.text:
                got_any_refusal = True
                assert got.json() == want.json(), path
    # Only application/json (with parameters) passes vLLM's check.
    assert got_any_refusal == (media_type is None or not media_type.startswith("application/json"))


LONG_ID_BYTES = 64 << 10
"""An ``X-Request-Id`` as long as issue 65's: vLLM's server (uvicorn) serves it."""
HEADER_BLOCK_BYTES = 1 << 20
"""Beyond what either edge takes in one request's headers."""


def test_a_64_kib_request_id_is_served_as_vllm_serves_it(
    vllm_server: Server, client: httpx.Client
) -> None:
    """Behind Serve's HAProxy at its 16 KiB buffer, such a request got HAProxy's HTML 400
    (and, seen in issue 65's runs, sometimes no answer at all)."""
    headers = {"X-Request-Id": "r" * LONG_ID_BYTES}
    with httpx.Client(base_url=vllm_server.base_url, timeout=120) as reference:
        want = reference.post("/v1/chat/completions", json=_chat(), headers=headers)
    for _ in range(5):
        got = client.post("/v1/chat/completions", json=_chat(), headers=headers)
        assert got.status_code == want.status_code == 200, (got.status_code, got.text[:200])
        assert got.json()["id"] == want.json()["id"] == f"chatcmpl-{'r' * LONG_ID_BYTES}"


def test_a_header_block_too_large_for_the_edge_gets_an_answer_with_a_body(
    client: httpx.Client,
) -> None:
    """Never a dropped connection: a 4xx with a body, every time."""
    headers = {"X-Request-Id": "r" * HEADER_BLOCK_BYTES}
    for _ in range(5):
        got = client.post("/v1/chat/completions", json=_chat(), headers=headers)
        assert 400 <= got.status_code < 500 and got.content, (got.status_code, got.text[:200])
