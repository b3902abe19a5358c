"""bench.observability's report, the dashboard's queries as it runs them, and the
``NAME:K=V`` variants the benches take."""

from __future__ import annotations

import json
import re
from pathlib import Path

from bench.harness.variants import variant_pairs
from bench.observability.report import DASHBOARD, panel_queries, report
from bench.observability.study import HISTOGRAMS, hops
from deployments.config.graph_config import REPO_ROOT


def test_variant_pairs_split_environment_from_graph_args() -> None:
    env, args = variant_pairs("RAY_SERVE_X=1,observability.metrics=false,text_placement=tier")
    assert env == {"RAY_SERVE_X": "1"}
    assert args == {"observability.metrics": "false", "text_placement": "tier"}
    assert variant_pairs("") == ({}, {})


def test_every_dashboard_query_has_its_variables_set(tmp_path: Path) -> None:
    panels = panel_queries(DASHBOARD, job="graph", application="default", rate_interval="30s")
    assert len(panels) == len(json.loads(DASHBOARD.read_text())["panels"])
    for title, targets in panels:
        assert targets, title
        for _, expression in targets:
            assert "$" not in expression, (title, expression)
            assert 'job="graph"' in expression, (title, expression)


def test_each_phase_reads_its_placements_hops() -> None:
    inline = {(h.name, h.where) for h in hops("inline", 60)}
    tier = {(h.name, h.where) for h in hops("tier", 60)}
    assert ("CPU per token", "Derender") in tier - inline
    assert ("inter-item time", "Derender") in tier - inline
    assert all("[60s]" in h.expression for h in hops("tier", 60))
    first = next(h for h in hops("tier", 60) if h.name == "call to first item back")
    assert 'callee="Derender"' in first.expression


def test_the_observation_count_covers_every_histogram_of_the_graph() -> None:
    source = (REPO_ROOT / "deployments/observability/metrics.py").read_text()
    made = re.findall(r'_histogram\(\s*"scaleout_(\w+)"', source)
    assert sorted(made) == sorted(HISTOGRAMS)


def test_the_report_names_each_hop_of_each_phase() -> None:
    hop = {"name": "render (chat_text)", "where": "Render", "expression": "x", "value": 0.0042}
    none = {"name": "queue", "where": "vLLM engine", "expression": "y", "value": None}
    observations = {"name": "histogram observations per output token", "where": "every tier",
                    "expression": "z", "value": 2.5}  # fmt: skip
    phase = {"placement": "inline", "start": 0.0, "end": 10.0, "requests": 3, "tokens": 1000,
             "replica_cpu_s": 0.5, "client_ttft_ms": [10.0, 20.0, 30.0],
             "client_e2e_ms": [100.0] * 3, "hops": [hop, none, observations]}  # fmt: skip
    args = {"tokens": 64, "requests": 3, "concurrency": 1, "placements": "inline", "out": "x"}
    text = report({"args": args, "phases": [phase], "observe_cost_us": [4.0, 5.0, 6.0]})
    assert "| render (chat_text) | Render | 4.2 ms |" in text
    assert "| queue | vLLM engine | – |" in text
    assert "TTFT p50 20.0 ms" in text
    # 2.5 observations of 5 µs against 500 µs of replica CPU per token
    assert "| inline | 2.50 | 500 µs | 2.5% |" in text


def test_the_trace_cost_bench_makes_a_requests_spans_when_on_and_none_off() -> None:
    """bench.observability.trace_cost times what it says: on, an inline stream's four
    spans under one Ingress span; off, none."""
    import asyncio

    from bench.harness.otlp_collector import running_collector
    from bench.observability.trace_cost import per_request_us
    from deployments.observability import tracing

    with running_collector() as collector:
        tracing.configure_tracing(None, "bench")
        asyncio.run(per_request_us(3, 1))
        tracing.configure_tracing(collector.endpoint, "bench")
        try:
            asyncio.run(per_request_us(2, 1))  # a warm-up request, then two timed
        finally:
            tracing.configure_tracing(None, "bench")  # shuts down: what is queued leaves
        spans = collector.spans()
    assert len(spans) == 12, spans
    roots = [s for s in spans if s.parent_id is None]
    assert len(roots) == 3
    for root in roots:
        children = sorted(s.name for s in spans if s.parent_id == root.span_id)
        assert children == ["generate", "render", "response"]
