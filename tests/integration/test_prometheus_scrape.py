"""The graph's own metrics, scraped by a real Prometheus two ways: the graph's
``/metrics`` and Ray's metrics agents (a cluster scrape, through the service discovery
file Ray writes). Each hop's histogram is there, and its count moves by exactly the
requests sent."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from bench.harness.prometheus import Prometheus, running_prometheus
from bench.harness.servers import Server
from bench.observability.report import DASHBOARD, panel_queries
from tests.integration.conftest import MODEL

# Where Ray's head writes its agents' scrape targets (Ray's default temp dir).
RAY_TARGETS = Path("/tmp/ray/prom_metrics_service_discovery.json")
# Ray's agents take each process's values every 10 s; a scrape comes every second.
SETTLED_S = 12.0
# How far back each read takes a series' latest value: a few 3 s scrapes.
LOOK_BACK = "15s"
WAIT_S = 60.0
INLINE, TIER, UNARY = 3, 2, 2


def chat(stream: bool) -> dict[str, object]:
    return {
        "model": MODEL,
        # Several KV blocks long, so the prefix router compares the Generate replicas.
        "messages": [{"role": "user", "content": "hello there " * 60}],
        "max_tokens": 4,
        "stream": stream,
    }


# Each check: a family (after ``ray_scaleout_``) and the labels it is read at.
CHECKS = {
    "render": ("unary_call_seconds_count", 'deployment="Render",method="chat_text"'),
    "first_inline": ("first_item_seconds_count", 'callee="Generate",kind="stream"'),
    "first_tier": ("first_item_seconds_count", 'callee="Derender",kind="stream"'),
    "first_unary": ("first_item_seconds_count", 'callee="Generate",kind="answer"'),
    "placed_inline": ("text_placement_total", 'placement="inline",reason="requested"'),
    "placed_tier": ("text_placement_total", 'placement="tier",reason="requested"'),
    "refused_400": ("refusals_total", 'status="400"'),
    # Items and routing decisions: more than one per request, never fewer.
    "gaps_generate": ("inter_item_seconds_count", 'deployment="Generate"'),
    "gaps_derender": ("inter_item_seconds_count", 'deployment="Derender"'),
    "gaps_ingress": ("inter_item_seconds_count", 'deployment="Ingress"'),
    "channel_batches": ("step_channel_batch_items_count", 'deployment="Derender"'),
    "routed": ("prefix_routing_total", 'deployment="Ingress"'),
    # Two Generate replicas: a request's prefix is compared across them once the
    # router knows their block keying (until then: unkeyed).
    "compared": ("prefix_routing_total", 'deployment="Ingress",outcome=~"prefix|no_match"'),
    "matched_blocks": ("prefix_matched_blocks_count", 'deployment="Ingress"'),
    "derender_tokens": ("derender_tokens_total", 'deployment="Derender"'),
}


def counts(job: str) -> dict[str, str]:
    """What each check reads, as PromQL, in one scrape job: each series' latest value
    over the last few scrapes (one scrape that timed out on a busy host leaves no gap)."""
    return {
        check: f'max_over_time(ray_scaleout_{name}{{job="{job}",application="default",{labels}}}'
        f"[{LOOK_BACK}])"
        for check, (name, labels) in CHECKS.items()
    }


EXACT = {
    "render": INLINE + TIER + UNARY + 1,  # the bad body is refused by Render
    "first_inline": INLINE,
    "first_tier": TIER,
    "first_unary": UNARY,
    "placed_inline": INLINE + UNARY,
    "placed_tier": TIER,
    "refused_400": 1,
}
AT_LEAST = {
    # every stream yields several items (role, tokens, finish, [DONE])
    "gaps_generate": INLINE + TIER,
    "gaps_derender": TIER,
    "gaps_ingress": INLINE + TIER,
    "channel_batches": 1,
    "routed": INLINE + UNARY,
    "compared": 1,
    "matched_blocks": 1,
    "derender_tokens": TIER * 4,
}


Series = dict[frozenset[tuple[str, str]], float]


def read(prometheus: Prometheus, jobs: list[str]) -> dict[tuple[str, str], Series]:
    """Each check's series (by their labels) in each job."""
    return {
        (job, check): {
            frozenset(one["metric"].items()): float(one["value"][1])
            for one in prometheus.query(expression)
        }
        for job in jobs
        for check, expression in counts(job).items()
    }


def moved_by(before: Series, now: Series) -> float:
    """How far a check's counters moved: each series now against itself before (a new
    series from 0). A series gone since (a replica an earlier test replaced, whose
    values Ray's agent stops exporting) moved nothing here."""
    return sum(value - before.get(labels, 0.0) for labels, value in now.items())


def settled(prometheus: Prometheus, jobs: list[str]) -> dict[tuple[str, str], Series]:
    """Every count, once none has moved for ``SETTLED_S`` (what earlier tests sent
    has reached Ray's agents and both scrapes)."""
    deadline = time.monotonic() + WAIT_S + SETTLED_S
    values, since = read(prometheus, jobs), time.monotonic()
    while time.monotonic() - since < SETTLED_S:
        assert time.monotonic() < deadline, f"the counts kept moving: {values}"
        time.sleep(1)
        now = read(prometheus, jobs)
        if now != values:
            values, since = now, time.monotonic()
    return values


def wait_for(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check() and time.monotonic() < deadline:
        time.sleep(1)


def test_prometheus_reads_each_hop_for_exactly_the_requests_sent(
    graph: Server, client: httpx.Client, tmp_path: Path
) -> None:
    port = urlsplit(graph.base_url).port
    # The graph's /metrics reads every node's Ray agent as well as the engines: on a
    # busy host one scrape can take over Prometheus's default timeout (the interval).
    # A Ray agent answers hundreds of KB: so can it.
    slow = {"scrape_interval": "3s", "scrape_timeout": "3s"}
    scrape_configs = [
        {"job_name": "graph", **slow, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]},
        {"job_name": "ray", **slow, "file_sd_configs": [{"files": [str(RAY_TARGETS)]}]},
    ]
    jobs = ["graph", "ray"]
    with running_prometheus(tmp_path, scrape_configs) as prometheus:

        def scraped() -> bool:
            targets = prometheus.targets_up()
            return len(targets) >= 2 and set(targets.values()) == {"up"}

        wait_for(scraped)  # a scrape that failed once (a slow answer) is tried again
        targets = prometheus.targets_up()
        assert set(targets.values()) == {"up"}, targets
        before = settled(prometheus, jobs)

        for placement, count, stream in (("inline", INLINE, True), ("tier", TIER, True),
                                         ("inline", UNARY, False)):  # fmt: skip
            for _ in range(count):
                response = client.post(
                    "/v1/chat/completions",
                    json=chat(stream),
                    headers={"X-Text-Placement": placement},
                )
                assert response.status_code == 200, response.text
        bad = client.post("/v1/chat/completions", json={"model": MODEL, "messages": "hi"})
        assert bad.status_code == 400, bad.text

        def delta() -> dict[tuple[str, str], float]:
            now = read(prometheus, jobs)
            return {key: moved_by(before[key], now[key]) for key in now}

        def done() -> bool:
            moved = delta()
            return all(moved[job, c] >= n for job in jobs for c, n in {**EXACT, **AT_LEAST}.items())

        wait_for(done)
        time.sleep(SETTLED_S)  # anything more than was sent would show by now
        moved = delta()
        for job in jobs:
            assert {c: moved[job, c] for c in EXACT} == EXACT, job
            short = {c: moved[job, c] for c, n in AT_LEAST.items() if moved[job, c] < n}
            assert not short, (job, short)

        # The Grafana dashboard on the graph's job: every query Prometheus takes, and
        # those of what these requests did have data.
        panels = panel_queries(DASHBOARD, job="graph", application="default", rate_interval="2m")
        assert {title for title, _ in panels} >= MUST_HAVE_DATA
        empty = [
            (title, expression)
            for title, targets in panels
            for _, expression in targets
            if not prometheus.query(expression) and title in MUST_HAVE_DATA
        ]
        assert not empty, empty


# Panels that the requests above feed (the rest: aborts, refusals' rate window…).
MUST_HAVE_DATA = {
    "Text requests by placement",
    "Render time (Render's unary calls)",
    "Ingress: call to first item back",
    "vLLM: queue, prefill (means), TTFT (engine)",
    "Inter-item time by tier (p50)",
    "Inter-item time by tier (p95)",
    "Derender CPU per token",
    "Step channels: batch size, oldest event's wait",
    "vLLM: requests running and waiting",
    "vLLM: output tokens/s and KV cache use",
}
