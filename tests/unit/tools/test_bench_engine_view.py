"""``bench.requests``' view inside the engine: vLLM's metrics read around a cell."""

from __future__ import annotations

import pytest

from bench.requests import engine_view
from bench.requests.engine_view import E2E, STEP_TOKENS, TTFT, delta, engine_table, totals
from bench.requests.study import Cell, ServerRun

# Two engines (the graph's /metrics labels each by replica), with the other lines a
# Prometheus exposition has around the samples read.
EXPOSITION = """\
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="0.3",model_name="m",replica="a"} 3.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m",replica="a"} 0.6
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m",replica="a"} 4.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m",replica="b"} 0.4
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m",replica="b"} 1.0
vllm:time_to_first_token_seconds_sum{model_name="m"} 0.1
vllm:time_to_first_token_seconds_count{model_name="m"} 5.0
vllm:iteration_tokens_total_sum{model_name="m"} 90.0
vllm:iteration_tokens_total_count{model_name="m"} 10.0
vllm:request_decode_time_seconds_sum{model_name="m"} 7.0
scaleout_engine_unfinished_requests{replica="a"} 2.0
"""


def test_totals_sum_each_family_over_every_engine_and_skip_other_samples() -> None:
    read = totals(EXPOSITION)
    assert read[f"{E2E}_sum"] == pytest.approx(1.0)
    assert read[f"{E2E}_count"] == 5.0
    assert read[f"{TTFT}_count"] == 5.0
    assert read[f"{STEP_TOKENS}_sum"] == 90.0
    assert "vllm:request_decode_time_seconds_sum" not in read


def test_a_cell_reads_what_it_added_and_nothing_without_metrics() -> None:
    before = totals(EXPOSITION)
    after = {**before, f"{E2E}_sum": 1.4, f"{E2E}_count": 7.0}
    added = delta(before, after)
    assert added[f"{E2E}_count"] == 2.0 and added[f"{STEP_TOKENS}_count"] == 0.0
    assert engine_view.mean_ms(added, E2E) == pytest.approx(200.0)
    assert engine_view.mean_ms(added, TTFT) is None  # no first token in the cell
    assert delta({}, after) == {} and delta(before, {}) == {}


def test_littles_law_counts_requests_in_the_engine() -> None:
    # 20 requests/s, each 200 ms in the engine: 4 of them there at a time.
    engine = {f"{E2E}_sum": 2.0, f"{E2E}_count": 10.0}
    assert engine_view.in_engine(engine, 20.0) == pytest.approx(4.0)
    steps = {f"{STEP_TOKENS}_sum": 90.0, f"{STEP_TOKENS}_count": 10.0}
    assert engine_view.tokens_per_step(steps) == 9.0
    assert engine_view.steps_per_s(steps, 2.0) == 5.0


def _cell(mode: str, e2e_in_engine_s: float) -> Cell:
    # 16 requests in 1 s at the client, 100 ms each (first output at 40 ms).
    return Cell(
        server="s",
        mode=mode,
        concurrency=16,
        round=0,
        requests=16,
        wall_s=1.0,
        ttft_ms=[40.0] * 16,
        e2e_ms=[100.0] * 16,
        cpu_s={},
        engine={
            f"{E2E}_sum": 16 * e2e_in_engine_s,
            f"{E2E}_count": 16.0,
            f"{TTFT}_sum": 16 * 0.01,
            f"{TTFT}_count": 16.0,
            f"{STEP_TOKENS}_sum": 400.0,
            f"{STEP_TOKENS}_count": 50.0,
        },
    )


def test_the_table_puts_the_engines_share_beside_the_clients() -> None:
    vllm = ServerRun("vllm", "vllm", [_cell("vllm", 0.09)])
    graph = ServerRun("g", "graph", [_cell("inline", 0.03)])
    floor = ServerRun("floor", "floor", [Cell("floor", "inline", 16, 0, 16, 1.0, [1], [1], {})])
    lines = engine_table([vllm, graph, floor])
    # 16/s × 90 ms = 1.4 requests in the engine; 50 steps of 8 tokens in 1 s.
    assert "| vllm | – | 16 | 1.4 | 90 | 100 | 10 | 40 | 50 | 8.0 |" in lines
    assert "| g | inline | 16 | 0.5 | 30 | 100 | 10 | 40 | 50 | 8.0 |" in lines
    assert not any(line.startswith("| floor") for line in lines)
    assert engine_table([floor]) == []
