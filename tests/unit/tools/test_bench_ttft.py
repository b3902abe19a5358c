"""``bench.requests.ttft``: a request's TTFT split into stages from its trace's spans."""

from __future__ import annotations

import argparse

from bench.harness.otlp_collector import Span
from bench.requests.ttft import BACK, ENGINE_TTFT, TTFT_ATTRIBUTE, Breakdown, report, stages

MS = 1_000_000


def _span(name: str, start_ms: float, end_ms: float, **attributes: float) -> Span:
    return Span(
        "t", name, None, name, "SERVER", int(start_ms * MS), int(end_ms * MS), "OK", attributes
    )


def test_vllms_ttft_splits_into_its_app_its_engine_and_the_way_back() -> None:
    llm = _span("llm_request", 4, 40, **{TTFT_ATTRIBUTE: 0.009})
    split = stages([llm], sent_ns=0, first_ns=15 * MS)
    assert split == {"client → engine (HTTP, render)": 4, ENGINE_TTFT: 9, BACK: 2}


def test_the_graphs_inline_ttft_splits_hop_by_hop_and_adds_up_to_the_clients() -> None:
    spans = [
        _span("POST /v1/chat/completions", 1, 90),
        _span("render", 3, 5.5),
        _span("generate", 8, 80),
        _span("llm_request", 9, 79, **{TTFT_ATTRIBUTE: 0.010}),
    ]
    split = stages(spans, sent_ns=0, first_ns=25 * MS)
    assert split == {
        "client → server's HTTP app": 1,
        "app → Render call": 2,
        "render (Render replica)": 2.5,
        "Render back → Generate call": 2.5,
        "Generate call → engine": 1,
        ENGINE_TTFT: 10,
        BACK: 6,
    }
    assert sum(split.values()) == 25


def test_a_tier_request_shows_its_derender_hop_and_a_missing_span_is_no_split() -> None:
    spans = [
        _span("POST /v1/chat/completions", 1, 90),
        _span("render", 3, 5),
        _span("derender", 7, 85),
        _span("generate", 10, 80),
        _span("llm_request", 11, 79, **{TTFT_ATTRIBUTE: 0.010}),
    ]
    split = stages(spans, sent_ns=0, first_ns=30 * MS)
    assert split is not None
    assert split["Render back → Derender call"] == 2 and split["Derender → Generate call"] == 3
    assert "Render back → Generate call" not in split
    assert sum(split.values()) == 30
    assert stages(spans[:2] + spans[3:], sent_ns=0, first_ns=30 * MS) is not None  # inline shape
    assert stages([s for s in spans if s.name != "generate"], sent_ns=0, first_ns=30 * MS) is None
    assert stages(spans[:-1], sent_ns=0, first_ns=30 * MS) is None


def test_the_report_lists_each_servers_stages_in_order_with_their_counts() -> None:
    vllm = Breakdown("vllm", "vllm", {ENGINE_TTFT: [9.0] * 4, BACK: [2.0] * 4}, [15.0] * 4)
    graph = Breakdown("graph", "inline", {"render (Render replica)": [2.5] * 3}, [25.0] * 3, 1)
    args = argparse.Namespace(requests=4, rounds=1, gap_s=0.0, graph_arg=[])
    text = report(args, [vllm, graph])
    assert "| stage | vllm | graph inline |" in text
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert [r.split(" | ")[0] for r in rows[1:4]] == [
        "| render (Render replica)",
        f"| {ENGINE_TTFT}",
        f"| {BACK}",
    ]
    assert "| render (Render replica) | – | 2.5 |" in text
    assert "| requests traced whole | 4 of 4 | 3 of 4 |" in text


def test_the_report_says_how_long_the_server_idled_before_each_request() -> None:
    vllm = Breakdown("vllm", "vllm", {ENGINE_TTFT: [9.0] * 4}, [15.0] * 4)
    args = argparse.Namespace(requests=4, rounds=1, gap_s=0.3, graph_arg=["a=1"])
    text = report(args, [vllm])
    assert (
        "`python -m bench.requests.ttft --requests 4 --rounds 1 --gap-s 0.3 --graph-arg a=1`"
        in text
    )
    assert "each sent 300 ms after the one before ended" in text
    args.gap_s = 0.0
    assert "each sent as the one before ended" in report(args, [vllm])
