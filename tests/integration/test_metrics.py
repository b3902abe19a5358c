"""/metrics: every engine's vLLM metrics in one Prometheus exposition, by replica."""

from __future__ import annotations

import time
from collections import defaultdict

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import MODEL, TOKENS_ONLY_PREFIX


def scrape(client: httpx.Client, prefix: str = "") -> dict[str, dict[str, float]]:
    """Family name → {replica: sum of that replica's samples}, for plain counters and gauges."""
    response = client.get(f"{prefix}/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=")
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name in (family.name, f"{family.name}_total"):
                out[family.name][sample.labels["replica"]] += sample.value
    return out


def test_metrics_carry_each_engines_vllm_metrics(client: httpx.Client) -> None:
    before = scrape(client)
    replicas = set(before["scaleout_engine_unfinished_requests"])
    assert len(replicas) == 2  # the default app's two Generate replicas
    # vLLM's own families, one series set per engine.
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:prompt_tokens"):
        assert set(before[name]) == replicas, name
    assert len(scrape(client, TOKENS_ONLY_PREFIX)["vllm:prompt_tokens"]) == 1

    body = {"model": MODEL, "prompt": "hi there", "max_tokens": 5, "ignore_eos": True}
    render = client.post("/v1/completions/render", json=body)
    assert render.status_code == 200, render.text
    prompt_tokens = len(render.json()[0]["token_ids"])
    reply = client.post("/v1/completions", json=body)
    assert reply.status_code == 200, reply.text
    # The engine's stat logger records a step as its outputs are handled; the
    # wait is a guard against a counter that never moves, not a deadline.
    deadline = time.monotonic() + 30
    while True:
        after = scrape(client)
        prompted = sum(after["vllm:prompt_tokens"].values()) - sum(
            before["vllm:prompt_tokens"].values()
        )
        generated = sum(after["vllm:generation_tokens"].values()) - sum(
            before["vllm:generation_tokens"].values()
        )
        if (prompted, generated) == (prompt_tokens, 5) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert (prompted, generated) == (prompt_tokens, 5)
