"""Nothing lost, nothing left running: abort, disconnect, auth, bad input, overload."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from bench.harness.servers import Server, long_chat
from bench.harness.sse_reader import Stream
from bench.metrics import running_requests as parse_running_requests
from tests.integration.conftest import API_KEY, AUTH, MODEL, TOKENS_ONLY_PREFIX
from tests.integration.test_skeleton import rendered, sse_payloads
from tests.support.leaving_clients import leave_once_running
from tests.support.leaving_clients import wait_idle as wait_engines_idle

# Streams that are still running when the test acts on them, on any host: paced
# (bench/harness/paced_decode.py), each lasts at least LONG × LONG_PACE_MS (80 s).
LONG = 4000
LONG_PACE_MS = 20
# How long a test waits for what must happen (a slot freed, engines idle): far
# below LONG's 80 s, so a request that was not freed is still running when the
# wait gives up; far above any stall of a loaded host. A guard, not a deadline.
HANG_GUARD_S = 30.0
JSON_BODY = {"Content-Type": "application/json"}
# What the Ingress logs when it calls a tier again (deployments/edge/tier_calls.py).
REPLICA_LOST_LINE = "Derender replica lost before the first item"


def running_requests(client: httpx.Client, prefix: str = "") -> dict[str, int]:
    return parse_running_requests(client.get(f"{prefix}/metrics").text)


def wait_idle(client: httpx.Client, within_s: float, prefix: str = "") -> float:
    """Seconds until every engine reports 0 running; fails after ``within_s``."""
    return wait_engines_idle(f"{str(client.base_url).rstrip('/')}{prefix}", within_s)


def long_body(
    kind: str, client: httpx.Client, tokens: int = LONG, pace_ms: float | None = LONG_PACE_MS
) -> tuple[str, dict[str, Any], dict[str, str]]:
    """(path, body, headers) of a long streamed request of one kind.

    ``pace_ms`` holds each engine step of the request that long
    (``bench/harness/paced_decode.py``): long in time, light in load.
    """
    chat = long_chat("think: what is 2 plus 3?", tokens, pace_ms)
    if kind in ("inline", "tier"):
        return "/v1/chat/completions", chat, {"X-Text-Placement": kind}
    request = rendered(client, {k: v for k, v in chat.items() if k != "stream_options"})
    request.update(output_mode=kind, stream=True, stream_options={"include_usage": True})
    if kind != "derender":
        request.pop("parse_context")
    return "/inference/v1/generate", request, {}


def test_abort_of_unknown_or_finished_ids_is_a_no_op(client: httpx.Client) -> None:
    done = client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
    ).json()["id"]
    response = client.post("/inference/v1/abort_requests", json={"request_ids": [done, "nope"]})
    # vLLM's empty 200: the answer tells nothing of which ids were live.
    assert response.status_code == 200 and response.content == b""
    assert client.get("/health").status_code == 200


@pytest.mark.parametrize("kind", ["tokens", "text", "derender", "inline", "tier"])
def test_disconnect_frees_the_engine(client: httpx.Client, kind: str) -> None:
    path, body, headers = long_body(kind, client)
    with (
        httpx.Client(base_url=str(client.base_url), timeout=60) as c,
        c.stream("POST", path, json=body, headers=headers) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()
        seen = 0
        for line in lines:
            seen += line.startswith("data: ")
            if seen >= 3:
                break
        assert any(running_requests(client).values())
    # Leaving the block closes the connection mid-stream; unfreed, the paced
    # request would run for another minute.
    wait_idle(client, within_s=HANG_GUARD_S)


# The tiny model ends a Messages answer after ~16 tokens: each step held this long, it
# still lasts far beyond the wait below, as LONG's requests do.
MESSAGES_PACE_MS = 3000
UNARY_CLIENTS = 6
# Issue 65's bound: the engines idle within this long of the last client leaving.
UNARY_FREED_WITHIN_S = 5.0


def long_unary(kind: str, client: httpx.Client) -> tuple[str, dict[str, Any], dict[str, str]]:
    """(path, body, headers) of a long unary request of one kind (route, placement)."""
    pace = {"pace_ms": LONG_PACE_MS}
    chat = {k: v for k, v in long_chat("hi", LONG, LONG_PACE_MS).items() if k != "stream_options"}
    chat["stream"] = False
    route, _, placement = kind.partition("-")
    headers = {"X-Text-Placement": placement} if placement else {}
    if route == "chat":
        return "/v1/chat/completions", chat, headers
    if route == "completions":
        body = {"model": MODEL, "prompt": "hi", "max_tokens": LONG, "ignore_eos": True}
        return "/v1/completions", {**body, "vllm_xargs": pace}, headers
    if route == "batch":
        body = {"model": MODEL, "prompt": ["hi", "ho"], "max_tokens": LONG, "ignore_eos": True}
        return "/v1/completions", {**body, "vllm_xargs": pace}, headers
    if route == "responses":
        body = {"model": MODEL, "input": "hi", "max_output_tokens": LONG, "ignore_eos": True}
        return "/v1/responses", {**body, "vllm_xargs": pace}, headers
    if route == "messages":
        body = {"model": MODEL, "max_tokens": LONG, "messages": [{"role": "user", "content": "hi"}]}
        return "/v1/messages", {**body, "vllm_xargs": {"pace_ms": MESSAGES_PACE_MS}}, headers
    path, request, _ = long_body(route, client)
    request.update(stream=False)
    request.pop("stream_options")
    return path, request, headers


@pytest.mark.parametrize(
    "kind",
    [
        "chat-inline", "chat-tier", "completions-inline", "completions-tier", "batch-inline",
        "batch-tier", "responses-inline", "responses-tier", "messages-inline", "messages-tier",
        "tokens", "text", "derender",
    ],
)  # fmt: skip
def test_a_unary_request_whose_client_leaves_frees_its_engine_slot(
    client: httpx.Client, kind: str
) -> None:
    """vLLM's server cancels a unary handler when its client goes away
    (``with_cancellation``). Here the clients close their connections while the engine
    runs their requests; before HAProxy ran without splicing (``scaleout-haproxy``),
    it did not pass on 7-10 of 20 such closes, and those requests ran to their last
    token."""
    path, body, headers = long_unary(kind, client)
    # Inline, a batch's prompts run at once; on the tier, a unary batch's prompts run in
    # turn (derender.py), one engine request at a time.
    engine_requests = UNARY_CLIENTS * (2 if kind == "batch-inline" else 1)
    leave_once_running(
        str(client.base_url),
        path,
        body,
        headers,
        clients=UNARY_CLIENTS,
        engine_requests=engine_requests,
        within_s=HANG_GUARD_S,
    )
    wait_idle(client, within_s=UNARY_FREED_WITHIN_S)


def protected_routes() -> list[tuple[str, str]]:
    from fastapi.routing import APIRoute

    from deployments.edge.guard import is_protected
    from deployments.ingress import app

    routes = [
        (method, route.path)
        for route in app.routes
        if isinstance(route, APIRoute)
        for method in sorted(route.methods)
        if is_protected(route.path)
    ]
    assert {p for _, p in routes} >= {
        "/v1/models", "/v1/chat/completions", "/v1/completions", "/inference/v1/generate",
        "/inference/v1/abort_requests", "/v1/chat/completions/render",
        "/v1/completions/render", "/v1/chat/completions/derender", "/v1/completions/derender",
    }, routes  # fmt: skip
    return routes


def test_every_protected_route_needs_the_key(client: httpx.Client) -> None:
    for method, path in protected_routes():
        url = f"{TOKENS_ONLY_PREFIX}{path}"
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
            response = client.request(method, url, json={}, headers=headers)
            assert response.status_code == 401, (method, path, headers, response.text)
            # vLLM's AuthenticationMiddleware body (tests/unit/edge/test_guard.py runs it).
            assert response.json() == {"error": "Unauthorized"}
        with_key = client.request(method, url, json={}, headers=AUTH)
        assert with_key.status_code != 401, (method, path)


def test_the_key_opens_the_routes(client: httpx.Client) -> None:
    models = client.get(f"{TOKENS_ONLY_PREFIX}/v1/models", headers=AUTH)
    assert models.status_code == 200
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    reply = client.post(f"{TOKENS_ONLY_PREFIX}/v1/chat/completions", json=chat, headers=AUTH)
    assert reply.status_code == 200, reply.text
    assert reply.headers["X-Text-Placement"] == "tier"
    abort = client.post(
        f"{TOKENS_ONLY_PREFIX}/inference/v1/abort_requests",
        json={"request_ids": ["x"]},
        headers=AUTH,
    )
    assert abort.status_code == 200


def test_health_and_metrics_stay_open(client: httpx.Client) -> None:
    assert client.get(f"{TOKENS_ONLY_PREFIX}/health").status_code == 200
    assert client.get(f"{TOKENS_ONLY_PREFIX}/metrics").status_code == 200


def test_legacy_abort_route_only_on_tokens_only_and_unauthenticated(client: httpx.Client) -> None:
    body = {"request_ids": ["x"]}
    assert client.post("/abort_requests", json=body).status_code == 404
    assert client.post(f"{TOKENS_ONLY_PREFIX}/abort_requests", json=body).status_code == 200


def test_overload_is_503_before_any_byte_and_held_requests_complete(
    client: httpx.Client,
) -> None:
    """The tokens-only Generate takes one request and queues one more; the rest get 503.

    The request that holds the one slot is paced (``bench/harness/paced_decode.py``)
    to last at least ``hold_tokens × hold_pace_ms`` (6 s), however fast or slow the
    host is, and the excess is sent only once the engine reports it running. So the
    excess always meets a full replica: one of it waits in the queue, the others
    are turned away. (Unpaced, the tiny model's 300 tokens took ~0.5 s, and a
    stalled client thread on this host once let all six through one by one.)
    """
    base = rendered(client, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    base.pop("parse_context")
    base.update(stream=True, stream_options={"include_usage": True})
    url = f"{client.base_url}{TOKENS_ONLY_PREFIX}/inference/v1/generate"
    hold_tokens, hold_pace_ms, excess_tokens, excess = 100, 60, 50, 4

    def generate(tokens: int, pace_ms: float | None = None) -> tuple[int, str | None, str]:
        request = json.loads(json.dumps(base))
        request["sampling_params"].update(max_tokens=tokens, ignore_eos=True)
        if pace_ms is not None:
            request["sampling_params"]["extra_args"] = {"pace_ms": pace_ms}
        with httpx.Client(timeout=120) as c:
            response = c.post(url, json=request, headers=AUTH)
            return response.status_code, response.headers.get("Retry-After"), response.text

    with ThreadPoolExecutor(1 + excess) as pool:
        holder = pool.submit(generate, hold_tokens, hold_pace_ms)
        deadline = time.monotonic() + 30
        while not any(running_requests(client, TOKENS_ONLY_PREFIX).values()):
            assert time.monotonic() < deadline, "the holding request never reached the engine"
            assert not holder.done(), holder.result()
            time.sleep(0.05)
        results = list(pool.map(lambda _: generate(excess_tokens), range(excess)))
        holder_status, _, holder_text = holder.result()

    assert holder_status == 200, holder_text
    assert sse_payloads(holder_text)[-2]["usage"]["completion_tokens"] == hold_tokens
    statuses = sorted(status for status, _, _ in results)
    assert statuses == [200] + [503] * (excess - 1), statuses
    for status, retry_after, text in results:
        if status == 503:
            assert retry_after is not None
            assert json.loads(text)["error"]["code"] == 503
        else:
            events = sse_payloads(text)
            assert events[-1] == "[DONE]"
            assert events[-2]["usage"]["completion_tokens"] == excess_tokens
    wait_idle(client, within_s=HANG_GUARD_S, prefix=TOKENS_ONLY_PREFIX)


def test_abort_metrics_and_health_reach_a_full_generate_replica(client: httpx.Client) -> None:
    """Control calls do not queue behind the streams that fill a replica.

    The tokens-only Generate takes one request at a time; one paced stream fills
    it. Serve would make a call into the replica wait for that stream to end (an
    abort of it would have nothing left to abort), so the control plane reaches
    replicas down their own subscriptions (``deployments/transport/control_channel.py``).
    """
    body = rendered(client, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    body.pop("parse_context")
    body.update(stream=True, request_id="fills-the-replica")
    body["sampling_params"].update(max_tokens=200, ignore_eos=True, extra_args={"pace_ms": 50})
    url = f"{TOKENS_ONLY_PREFIX}/inference/v1/generate"
    with (
        httpx.Client(base_url=str(client.base_url), timeout=60) as c,
        c.stream("POST", url, json=body, headers=AUTH) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        assert list(running_requests(client, TOKENS_ONLY_PREFIX).values()) == [1]
        assert client.get(f"{TOKENS_ONLY_PREFIX}/health").status_code == 200
        abort = client.post(
            f"{TOKENS_ONLY_PREFIX}/inference/v1/abort_requests",
            json={"request_ids": [body["request_id"]]},
            headers=AUTH,
        )
        assert abort.status_code == 200 and abort.content == b""
        # Answered means let go: the engine no longer counts it.
        assert list(running_requests(client, TOKENS_ONLY_PREFIX).values()) == [0]
        events = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "abort"
    # Cut short: the engine made fewer than the 200 tokens it was asked for.
    made = sum(len(json.loads(e)["choices"][0].get("token_ids") or []) for e in events[:-1])
    assert made < 200, made


BAD_INPUTS: list[tuple[str, str, Any, int]] = [
    # (method+path, what, body (str = raw bytes), expected status)
    ("/v1/chat/completions", "not json", "{", 400),
    ("/v1/chat/completions", "json array", "[]", 400),
    ("/v1/chat/completions", "no messages", {"model": MODEL}, 400),
    ("/v1/chat/completions", "messages not a list", {"model": MODEL, "messages": "hi"}, 400),
    ("/v1/chat/completions", "unknown model", {"model": "nope", "messages": []}, 404),
    ("/v1/chat/completions", "negative max_tokens",
     {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}, 400),
    ("/v1/chat/completions", "temperature a string",
     {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, 400),
    ("/v1/chat/completions", "n zero",
     {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 0}, 400),
    ("/v1/chat/completions", "stream_options without stream",
     {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
      "stream_options": {"include_usage": True}}, 400),
    ("/v1/chat/completions", "tool_choice names a missing tool",
     {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
      "tool_choice": {"type": "function", "function": {"name": "f"}}}, 400),
    ("/v1/completions", "not json", "nope", 400),
    ("/v1/completions", "no prompt", {"model": MODEL}, 400),
    ("/v1/completions", "prompt a number", {"model": MODEL, "prompt": 5}, 400),
    ("/v1/completions", "unknown model", {"model": "nope", "prompt": "x"}, 404),
    ("/v1/completions", "logprobs too many", {"model": MODEL, "prompt": "x", "logprobs": 10**6},
     400),
    ("/v1/chat/completions/render", "empty body", "", 400),
    ("/v1/chat/completions/render", "no model field types", {"messages": 3}, 400),
    ("/v1/completions/render", "prompt null", {"model": MODEL, "prompt": None}, 400),
    ("/inference/v1/generate", "not json", "{{", 400),
    ("/inference/v1/generate", "body a list", [1, 2], 400),
    ("/inference/v1/generate", "empty token_ids",
     {"token_ids": [], "sampling_params": {}}, 400),
    ("/inference/v1/generate", "negative token_ids",
     {"token_ids": [1, -2], "sampling_params": {}}, 400),
    ("/inference/v1/generate", "token_ids strings",
     {"token_ids": ["a"], "sampling_params": {}}, 400),
    ("/inference/v1/generate", "no sampling_params", {"token_ids": [1]}, 400),
    ("/inference/v1/generate", "unknown output_mode",
     {"token_ids": [1], "sampling_params": {}, "output_mode": "pdf"}, 400),
    ("/inference/v1/generate", "text without detokenize",
     {"token_ids": [1], "sampling_params": {"detokenize": False}, "output_mode": "text"}, 400),
    ("/inference/v1/generate", "derender without detokenize",
     {"token_ids": [1], "sampling_params": {"detokenize": False}, "output_mode": "derender"},
     400),
    ("/inference/v1/generate", "bad parse_context",
     {"token_ids": [1], "sampling_params": {}, "output_mode": "derender",
      "parse_context": {"tools": 3}}, 400),
    ("/inference/v1/generate", "unknown model",
     {"token_ids": [1], "sampling_params": {}, "model": "nope"}, 404),
    ("/v1/chat/completions/derender", "not json", "x", 400),
    ("/v1/chat/completions/derender", "no generate_response", {"chat_request": None}, 400),
    ("/v1/completions/derender", "empty generate_responses", {"generate_responses": []}, 400),
    ("/inference/v1/abort_requests", "missing request_ids", {}, 400),
    ("/inference/v1/abort_requests", "not json", "{", 400),
    ("/inference/v1/abort_requests", "ids not strings", {"request_ids": [1]}, 400),
    ("/tokenize", "not json", "{", 400),
    ("/tokenize", "neither prompt nor messages", {"model": MODEL}, 400),
    ("/tokenize", "unknown model", {"model": "nope", "prompt": "x"}, 404),
    ("/detokenize", "tokens strings", {"model": MODEL, "tokens": ["a"]}, 400),
    ("/detokenize", "no tokens", {"model": MODEL}, 400),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "what", "body", "status"), BAD_INPUTS, ids=[f"{p} {w}" for p, w, _, _ in BAD_INPUTS]
)
def test_bad_input_is_a_clear_4xx(
    client: httpx.Client, path: str, what: str, body: Any, status: int
) -> None:
    if isinstance(body, str):  # sent as JSON, so the JSON parser refuses it
        response = client.post(path, content=body.encode(), headers=JSON_BODY)
    else:
        response = client.post(path, json=body)
    assert response.status_code == status, (what, response.text)
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"} and error["code"] == status
    assert "Traceback" not in error["message"]


def test_oversize_body_is_413_and_text_mode_on_tokens_only_is_400(client: httpx.Client) -> None:
    huge = b'{"token_ids": [' + b"1," * (17 * 2**20) + b'1], "sampling_params": {}}'
    response = client.post("/inference/v1/generate", content=huge, headers=JSON_BODY)
    assert response.status_code == 413

    def chunked() -> Iterator[bytes]:  # no Content-Length: sent chunked
        for start in range(0, len(huge), 2**20):
            yield huge[start : start + 2**20]

    response = client.post("/inference/v1/generate", content=chunked(), headers=JSON_BODY)
    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == 413
    small = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2}).encode()
    response = client.post(
        "/v1/completions", content=iter([small[:5], small[5:]]), headers=JSON_BODY
    )
    assert response.status_code == 200, response.text
    for mode in ("text", "derender"):
        body = {"token_ids": [1, 2], "sampling_params": {}, "output_mode": mode}
        reply = client.post(f"{TOKENS_ONLY_PREFIX}/inference/v1/generate", json=body, headers=AUTH)
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["param"] == "output_mode"


def test_graph_still_serves_after_bad_inputs(client: httpx.Client) -> None:
    """All the bad inputs at once, from 8 clients: each answered 4xx, then the graph
    answers a chat and no engine holds a request any more."""

    def send(case: tuple[str, str, Any, int]) -> int:
        path, _, body, _ = case
        with httpx.Client(base_url=str(client.base_url), timeout=60) as c:
            if isinstance(body, str):
                return c.post(path, content=body.encode(), headers=JSON_BODY).status_code
            return c.post(path, json=body).status_code

    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(send, BAD_INPUTS * 3))
    assert statuses == [status for _, _, _, status in BAD_INPUTS * 3]
    wait_idle(client, within_s=HANG_GUARD_S)
    reply = client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": 0},
    )
    assert reply.status_code == 200
    assert "Hello!" in reply.json()["choices"][0]["message"]["content"]


def derender_replica_pids(client: httpx.Client) -> dict[str, int]:
    """Each Derender replica's PID, from the headers of short tier chats.

    Streamed: the Ingress's step channel to a replica counts as one of its ongoing
    requests, so unary chats all go to a replica the Ingress has no channel to yet."""
    pids: dict[str, int] = {}
    deadline = time.monotonic() + 180
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    while len(pids) < 2 and time.monotonic() < deadline:
        reply = client.post(
            "/v1/chat/completions",
            json={**chat, "stream": True},
            headers={"X-Text-Placement": "tier"},
        )
        if reply.status_code == 200:
            pids[reply.headers["X-Served-By"]] = int(reply.headers["X-Served-By-Pid"])
    assert len(pids) == 2, pids
    return pids


def test_a_lost_derender_replica_cuts_its_running_stream_and_loses_none_not_yet_begun(
    graph: Server, client: httpx.Client
) -> None:
    """A Derender replica is killed while it streams one request and makes the first
    token of others. The running stream ends with an error event and [DONE]. The
    others have sent the client nothing yet: the Ingress calls the other replica, and
    each is served whole, with no error (before, each got a 503). The engines free
    every slot and Serve brings the replica back. (One kill for both.)"""
    pids = derender_replica_pids(client)
    path, body, headers = long_body("tier", client)
    running = Stream(str(client.base_url), path, body, headers)
    running.start()
    assert running.wait_first(60) and running.error is None, running.error
    lost = running.headers["x-served-by"]
    (kept,) = set(pids) - {lost}
    log_before = graph.log_path.read_text(errors="replace").count(REPLICA_LOST_LINE)
    not_begun = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "stream": True,
        # Each engine step of these requests is held 3 s: no first token for 3 s.
        "vllm_xargs": {"pace_ms": 3000},
    }
    streams = [
        Stream(
            str(client.base_url), "/v1/chat/completions", not_begun, {"X-Text-Placement": "tier"}
        )
        for _ in range(8)
    ]
    for stream in streams:
        stream.start()
    deadline = time.monotonic() + HANG_GUARD_S
    while sum(running_requests(client).values()) < len(streams) + 1:  # all through Derender
        assert time.monotonic() < deadline, running_requests(client)
        time.sleep(0.05)
    assert not any(stream.events for stream in streams), "a first token came before the kill"
    os.kill(pids[lost], signal.SIGKILL)

    running.join(60)
    assert running.error is None, running.error
    assert running.events[-1] == "[DONE]"
    errors = [e for e in running.events if isinstance(e, dict) and "error" in e]
    assert errors and errors[0]["error"]["code"] == 503, running.events[-3:]
    for stream in streams:
        stream.join(60)
    for stream in streams:
        assert stream.error is None, stream.error
        assert not [e for e in stream.events if isinstance(e, dict) and "error" in e]
        assert stream.events[-1] == "[DONE]" and stream.finish_reasons() == ["length"]
        assert stream.headers["x-served-by"] == kept
    if graph.process is not None:  # a graph of the suite's own, whose log it has
        log_after = graph.log_path.read_text(errors="replace").count(REPLICA_LOST_LINE)
        assert log_after > log_before, "no stream not yet begun was on the replica killed"
    wait_idle(client, within_s=HANG_GUARD_S)
    # Serve brings the killed replica back before the next test.
    assert len(derender_replica_pids(client)) == 2


# A Generate replica killed mid-stream: tests/integration/test_prefix_routing.py, on
# the replica that streams a conversation's turn (one kill, one engine start, for both).
