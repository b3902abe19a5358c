"""The Derender tier: placement routing, replicas, vLLM's /derender (against
``vllm launch render``), output_mode derender."""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.harness.servers import Server
from tests.integration.conftest import AUTH, MODEL, TOKENS_ONLY_PREFIX
from tests.integration.test_parity_vllm import SHAPES
from tests.integration.test_skeleton import rendered, sse_payloads


def test_placement_header_routes_and_is_echoed(client: httpx.Client) -> None:
    body = {**SHAPES["chat"], "max_tokens": 20}
    default = client.post("/v1/chat/completions", json=body)
    assert default.headers["X-Text-Placement"] == "inline"
    messages = {}
    for placement in ("inline", "tier", "TIER"):
        response = client.post(
            "/v1/chat/completions", json=body, headers={"X-Text-Placement": placement}
        )
        assert response.status_code == 200, response.text
        assert response.headers["X-Text-Placement"] == placement.lower()
        assert response.headers["X-Served-By"]
        messages[placement] = response.json()["choices"][0]["message"]["content"]
    assert (
        messages["inline"] == messages["tier"] == default.json()["choices"][0]["message"]["content"]
    )


def test_bad_placement_header_is_400(client: httpx.Client) -> None:
    response = client.post(
        "/v1/chat/completions", json=SHAPES["chat"], headers={"X-Text-Placement": "gpu"}
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "X-Text-Placement"


def test_two_derender_replicas_each_serve_streams(client: httpx.Client) -> None:
    body = {**SHAPES["reasoning"], "max_tokens": 120, "stream": True}

    def one(_: int) -> tuple[str, int]:
        with httpx.Client(base_url=str(client.base_url), timeout=120) as c:
            response = c.post(
                "/v1/chat/completions", json=body, headers={"X-Text-Placement": "tier"}
            )
            assert response.status_code == 200, response.text
            events = sse_payloads(response.text)
            assert events[-1] == "[DONE]"
            return response.headers["X-Served-By"], len(events)

    with ThreadPoolExecutor(8) as pool:
        served = list(pool.map(one, range(8)))
    replicas = {replica for replica, _ in served}
    assert len(replicas) == 2, served


def generate_tokens(client: httpx.Client, body: dict[str, Any], stream: bool) -> Any:
    request = rendered(client, body)
    prompt = request["token_ids"]
    request.pop("parse_context")
    response = client.post("/inference/v1/generate", json={**request, "stream": stream})
    assert response.status_code == 200, response.text
    return prompt, (sse_payloads(response.text)[:-1] if stream else response.json())


def drop_volatile(value: Any) -> Any:
    """``created`` stamps and random tool-call ids differ between two runs."""
    if isinstance(value, dict):
        out = {k: drop_volatile(v) for k, v in value.items() if k != "created"}
        if "function" in out and "id" in out:
            out["id"] = "<tool-call-id>" if out["id"] else out["id"]
        if "last_tool_call_ids" in out:
            out["last_tool_call_ids"] = ["<tool-call-id>" for _ in out["last_tool_call_ids"]]
        return out
    if isinstance(value, list):
        return [drop_volatile(v) for v in value]
    return value


@pytest.mark.parametrize("shape", ["chat", "reasoning+tool", "logprobs"])
def test_derender_batch_equals_vllm_launch_render(
    client: httpx.Client, vllm_render: Server, shape: str
) -> None:
    """Our /v1/chat/completions/derender answers what ``vllm launch render``'s does."""
    body = SHAPES[shape]
    prompt, generated = generate_tokens(client, body, stream=False)
    payload = {"generate_response": generated, "chat_request": body, "prompt_token_ids": prompt}
    ours = client.post("/v1/chat/completions/derender", json=payload)
    assert ours.status_code == 200, ours.text
    theirs = httpx.post(
        f"{vllm_render.base_url}/v1/chat/completions/derender", json=payload, timeout=60
    )
    assert theirs.status_code == 200, theirs.text
    assert drop_volatile(ours.json()) == drop_volatile(theirs.json())


def test_derender_per_chunk_equals_vllm_launch_render(
    client: httpx.Client, vllm_render: Server
) -> None:
    """Chunk by chunk, each carrying the state the last answer gave, as vLLM's
    stateless per-chunk protocol runs."""
    body = SHAPES["reasoning+tool"]
    prompt, chunks = generate_tokens(client, body, stream=True)
    assert len(chunks) > 5
    ours_state: Any = None
    theirs_state: Any = None
    with httpx.Client(base_url=vllm_render.base_url, timeout=60) as reference:
        for chunk in chunks:
            base = {"stream": True, "generate_chunk": chunk, "chat_request": body,
                    "prompt_token_ids": prompt}  # fmt: skip
            ours = client.post(
                "/v1/chat/completions/derender", json={**base, "stream_state": ours_state}
            )
            assert ours.status_code == 200, ours.text
            theirs = reference.post(
                "/v1/chat/completions/derender", json={**base, "stream_state": theirs_state}
            )
            assert theirs.status_code == 200, theirs.text
            assert drop_volatile(ours.json()) == drop_volatile(theirs.json())
            ours_state = ours.json()["stream_state"]
            theirs_state = theirs.json()["stream_state"]


def test_completion_derender_batch_equals_vllm_launch_render(
    client: httpx.Client, vllm_render: Server
) -> None:
    body = {"model": MODEL, "prompt": "The capital of France", "max_tokens": 6, "temperature": 0}
    request = client.post("/v1/completions/render", json={**body, "logprobs": 2}).json()[0]
    generated = client.post("/inference/v1/generate", json=request).json()
    payload = {"generate_responses": [generated], "prompt_token_ids": [request["token_ids"]]}
    ours = client.post("/v1/completions/derender", json=payload)
    assert ours.status_code == 200, ours.text
    theirs = httpx.post(f"{vllm_render.base_url}/v1/completions/derender", json=payload, timeout=60)
    assert theirs.status_code == 200, theirs.text
    assert drop_volatile(ours.json()) == drop_volatile(theirs.json())
    assert ours.json()["choices"][0]["text"]


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda p: p["generate_response"].update(output_mode="text", choices=[
            {**c, "text": "x"} for c in p["generate_response"]["choices"]]), "text"),
        (lambda p: p["generate_response"]["choices"][0].update(token_ids=[]), "token_ids"),
        (lambda p: p.pop("chat_request"), "chat_request"),
    ],
    ids=["text-response", "empty-token-ids", "parser-without-chat-request"],
)  # fmt: skip
def test_derender_rejects_bad_input(client: httpx.Client, mutate: Any, needle: str) -> None:
    body = SHAPES["chat"]
    prompt, generated = generate_tokens(client, body, stream=False)
    payload = {"generate_response": generated, "chat_request": body, "prompt_token_ids": prompt}
    mutate(payload)
    response = client.post("/v1/chat/completions/derender", json=payload)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == 400 and needle in error["message"]


# U+2028, U+2029 and U+0085 end a line for ``str.splitlines`` but not for SSE,
# and JSON writers leave them unescaped inside strings.
UNICODE_LINE_ENDS = "a\u2028b\u2029c\u0085d"


@pytest.mark.parametrize("stream", [True, False])
def test_text_with_unicode_line_ends_streams_whole_in_derender_mode(
    client: httpx.Client, stream: bool
) -> None:
    """The engine is made to write U+2028/U+2029/U+0085 (a regex grammar) and the
    derender stream carries them as text, not as broken events."""
    body = {
        **SHAPES["no-thinking"],
        "structured_outputs": {"regex": UNICODE_LINE_ENDS},
        "max_tokens": 40,
    }
    request = {**rendered(client, body), "output_mode": "derender", "stream": stream}
    response = client.post("/inference/v1/generate", json=request)
    assert response.status_code == 200, response.text
    if not stream:
        assert response.json()["choices"][0]["message"]["content"] == UNICODE_LINE_ENDS
        return
    assert response.text.count("data: ") == len(response.text.split("\n\n")) - 1
    events = sse_payloads(response.text)
    assert events[-1] == "[DONE]"
    content = "".join(
        choice["delta"].get("content") or "" for event in events[:-1] for choice in event["choices"]
    )
    assert content == UNICODE_LINE_ENDS


def _sent_to_generate(client: httpx.Client) -> Counter[str]:
    """The tokens-only application's Derender requests to Generate so far, by how they
    went (``via``)."""
    sent: Counter[str] = Counter()
    response = client.get(f"{TOKENS_ONLY_PREFIX}/metrics", headers=AUTH)
    assert response.status_code == 200, response.text
    for family in text_string_to_metric_families(response.text):
        if family.name == "ray_scaleout_requests_sent":
            for sample in family.samples:
                if (
                    sample.labels.get("callee") == "Generate"
                    and sample.labels.get("application") == "tokens-only"
                ):
                    sent[sample.labels["via"]] += int(sample.value)
    return sent


def test_tier_requests_ride_the_request_channels_generate_opened(client: httpx.Client) -> None:
    """With ``request_channels`` (the tokens-only application), once a Generate replica
    has served a Derender replica it opens a request channel back to it, and that
    Derender's next requests there go on it rather than as Serve calls
    (``transport/request_channel.py``), with the answers they get."""
    before = _settled_sends(client)
    body = {**SHAPES["chat"], "max_tokens": 12}
    tier = {"X-Text-Placement": "tier", **AUTH}
    contents = set()
    for i in range(12):
        stream = i % 2 == 1
        response = client.post(
            f"{TOKENS_ONLY_PREFIX}/v1/chat/completions",
            json={**body, "stream": stream},
            headers=tier,
        )
        assert response.status_code == 200, response.text
        if stream:
            chunks = [c for c in sse_payloads(response.text) if isinstance(c, dict)]
            deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
            contents.add("".join(d.get("content") or "" for d in deltas))
        else:
            contents.add(response.json()["choices"][0]["message"]["content"])
    assert len(contents) == 1, contents  # greedy: every way gives one answer
    sent = _settled_sends(client) - before
    assert sum(sent.values()) == 12, sent
    # A replica's first request from a Derender replica is a call (it opens the channel).
    assert sent["channel"] >= 8, sent


def _settled_sends(client: httpx.Client) -> Counter[str]:
    """``_sent_to_generate`` once two reads more than an export period apart agree:
    Ray exports a replica's counters every few seconds, so the last requests' come late."""
    last = _sent_to_generate(client)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        time.sleep(12)
        now = _sent_to_generate(client)
        if now == last:
            break
        last = now
    return last
