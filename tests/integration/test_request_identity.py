"""Request identity: a request id names what a client asked for, never what it may end.

Two clients may send the same ``request_id`` (or ``X-Request-Id``). vLLM runs
both to their end: a request's own cleanup ends only its own engine request.
An explicit abort by that id ends both, as vLLM's does, and answers vLLM's
empty 200 (whether an id was live is nobody's to learn from it).
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from bench.harness.sse_reader import Stream
from tests.integration.conftest import MODEL
from tests.integration.test_failure_semantics import (
    HANG_GUARD_S,
    long_body,
    running_requests,
    wait_idle,
)

# Paced (bench/harness/paced_decode.py): the first request could run 80 s; it is
# ended by an explicit abort once it has streamed on past the others' ends, so no
# host is too slow for the others to finish beside it.
TOKENS = 4000
PACE_MS = 20
# Events the first must still stream after the others ended (and cleaned up).
STREAMS_ON = 25
KINDS = ["tokens", "derender", "inline", "tier", "inline-header"]


def _with_id(kind: str, body: dict[str, Any], headers: dict[str, str], shared: str) -> None:
    """Give the request the id ``shared``: in the body, or as vLLM's header."""
    if kind.endswith("-header"):
        headers["X-Request-Id"] = shared
        body.pop("request_id", None)
    else:
        body["request_id"] = shared


def _short(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """The same request, one token long, not streamed."""
    short = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    if kind in ("tokens", "derender", "tokens-header"):
        short["sampling_params"] = {**body["sampling_params"], "max_tokens": 1}
        short.pop("vllm_xargs", None)
    else:
        short.update(max_tokens=1)
        short.pop("vllm_xargs", None)
    return short


def _refused(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """The same request, refused (for generate: by the engine's server, which holds it)."""
    return {**_short(kind, body), "model": "no-such-model"}


def _long(
    kind: str, client: httpx.Client, shared: str
) -> tuple[str, dict[str, Any], dict[str, str]]:
    path, body, headers = long_body(
        kind.removesuffix("-header"), client, tokens=TOKENS, pace_ms=PACE_MS
    )
    headers = dict(headers)
    _with_id(kind, body, headers, shared)
    return path, body, headers


def test_a_request_that_ends_leaves_another_with_its_id_running(client: httpx.Client) -> None:
    """Per kind (all side by side, each with its own id): while the first request runs,
    another client's with the same id finishes and a third is refused; the first
    streams on after both, until an abort by its id ends it."""
    firsts: dict[str, tuple[Stream, str, dict[str, Any], dict[str, str]]] = {}
    for kind in KINDS:
        path, body, headers = _long(kind, client, f"shared-{kind}-{uuid.uuid4().hex[:8]}")
        firsts[kind] = (Stream(str(client.base_url), path, body, headers), path, body, headers)
        firsts[kind][0].start()

    def others(kind: str) -> None:
        first, path, body, headers = firsts[kind]
        assert first.wait_first(60) and first.error is None, (kind, first.error)
        # Another client's request with the same id, finished and refused, while the first runs.
        short = client.post(path, json=_short(kind, body), headers=headers)
        assert short.status_code == 200, (kind, short.text)
        refused = client.post(path, json=_refused(kind, body), headers=headers)
        assert refused.status_code == 404, (kind, refused.text)
        # The others' ends (and their cleanup) left the first running: it streams on.
        seen = len(first.events)
        deadline = time.monotonic() + 60
        while len(first.events) < seen + STREAMS_ON and not first.ended_at:
            assert time.monotonic() < deadline, f"{kind}: the first stopped streaming"
            time.sleep(0.05)
        assert not first.ended_at, (kind, first.finish_reasons(), first.events[-2:])
        abort = {"request_ids": [first.stream_id]}
        assert client.post("/inference/v1/abort_requests", json=abort).status_code == 200

    with ThreadPoolExecutor(len(KINDS)) as pool:
        list(pool.map(others, KINDS))
    for kind, (first, *_) in firsts.items():
        first.join(120)
        assert first.error is None, (kind, first.error)
        assert first.events[-1] == "[DONE]", kind
        # Ended by the abort, not by another request's end: it streamed on after those.
        assert first.finish_reasons() == ["abort"], (kind, first.events[-3:])
        assert 0 < first.token_count() < TOKENS, kind
    wait_idle(client, within_s=HANG_GUARD_S)


@pytest.mark.parametrize("kind", ["tokens", "tier", "inline-header", "tokens-header"])
def test_an_abort_by_id_ends_every_request_with_that_id(client: httpx.Client, kind: str) -> None:
    shared = f"both-{kind}-{uuid.uuid4().hex[:8]}"
    path, body, headers = _long(kind, client, shared)
    streams = [Stream(str(client.base_url), path, body, headers) for _ in range(2)]
    for stream in streams:
        stream.start()
    for stream in streams:
        assert stream.wait_first(60) and stream.error is None, stream.error
    # The id both clients got back (``chatcmpl-…`` or ``generate-tokens-…``).
    (returned,) = {stream.stream_id for stream in streams}
    answer = client.post("/inference/v1/abort_requests", json={"request_ids": [returned]})
    # vLLM's answer: an empty 200, whatever the ids held.
    assert answer.status_code == 200 and answer.content == b"", answer.text
    for stream in streams:
        stream.join(120)
        assert stream.error is None, stream.error
        assert stream.finish_reasons() == ["abort"], stream.events[-3:]
    wait_idle(client, within_s=HANG_GUARD_S)


def test_abort_answer_says_nothing_of_what_was_held(client: httpx.Client) -> None:
    unknown = client.post("/inference/v1/abort_requests", json={"request_ids": ["nope"]})
    assert unknown.status_code == 200 and unknown.content == b""


@pytest.mark.parametrize("placement", ["inline", "tier"])
def test_unary_request_aborted_before_its_first_token_answers_200_abort(
    client: httpx.Client, placement: str
) -> None:
    """As vLLM: the aborted choice, empty, ``finish_reason: "abort"``; never a 4xx.

    Its first engine step is held 3 s (paced), so the abort lands before any token."""
    shared = f"prefill-{placement}-{uuid.uuid4().hex[:8]}"
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "request_id": shared,
        "vllm_xargs": {"pace_ms": 3000},
    }
    answer: dict[str, httpx.Response] = {}

    def send() -> None:
        with httpx.Client(base_url=str(client.base_url), timeout=60) as c:
            answer["r"] = c.post(
                "/v1/chat/completions", json=body, headers={"X-Text-Placement": placement}
            )

    sender = threading.Thread(target=send)
    sender.start()
    deadline = time.monotonic() + 30
    while sum(running_requests(client).values()) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sum(running_requests(client).values()) == 1
    # The id the answer will carry, known before it comes: vLLM's ``chatcmpl-<request_id>``.
    aborted = client.post(
        "/inference/v1/abort_requests", json={"request_ids": [f"chatcmpl-{shared}"]}
    )
    assert aborted.status_code == 200
    sender.join(60)
    response = answer["r"]
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "abort", choice
    assert not choice["message"].get("content"), choice
    wait_idle(client, within_s=HANG_GUARD_S)


def test_a_request_id_header_that_is_not_utf8_is_served(client: httpx.Client) -> None:
    """vLLM takes any header bytes; Serve's proxy answered 500 for these until the proxy
    edge (``deployments/edge/proxy_middleware.py``) passed them on as UTF-8."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    response = client.post("/v1/chat/completions", json=body, headers={"X-Request-Id": b"id-\xff"})
    assert response.status_code == 200, response.text
    # The Latin-1 reading of the value's UTF-8 (vLLM's id reads "id-\xff" itself).
    assert response.json()["id"] == "chatcmpl-id-" + "\xff".encode().decode("latin-1")
