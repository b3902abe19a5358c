"""The experiment harness's pure parts: the seed's TPOT, percentiles, arrivals, shapes, table."""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path
from typing import Any

import pytest

import bench.topology
from bench.arrivals import Phase, arrival_times, parse_ramp
from bench.capacity import Rung, highest
from bench.cli import reproducing_command
from bench.clients import CLIENTS
from bench.metrics import engine_busy, engine_steps, running_requests
from bench.report import cell_text, cpu_per_1k_table, markdown_table
from bench.shapes import make_requests, output_range
from bench.stats import CellSummary, RequestRecord, percentile, summarize, tpot_ms
from bench.topology import Overrides, topologies_config, topology_config
from deployments.config.graph_config import GraphConfig
from deployments.config.topologies import TOPOLOGIES


def test_tpot_is_last_minus_first_delta_over_tokens_minus_one() -> None:
    # 11 tokens in 4 coalesced chunks: first at 0.10 s, last at 0.60 s.
    assert tpot_ms([0.10, 0.25, 0.40, 0.60], 11) == pytest.approx(50.0)
    # The chunking does not matter, only the first and last delta.
    assert tpot_ms([0.10, 0.60], 11) == pytest.approx(50.0)
    assert tpot_ms([0.10], 1) is None
    assert tpot_ms([], 5) is None


def test_record_metrics_from_a_synthetic_trace() -> None:
    record = RequestRecord(0, scheduled_s=1.0, sent_s=1.0, delta_s=[1.2, 1.5, 2.0])
    record.output_tokens, record.done_s = 9, 2.1
    assert record.ttft_ms() == pytest.approx(200.0)
    assert record.tpot_ms() == pytest.approx(100.0)
    assert record.e2e_ms() == pytest.approx(1100.0)
    failed = RequestRecord(1, 1.0, sent_s=1.0, delta_s=[1.2], error="HTTP 503")
    assert failed.ttft_ms() is None and not failed.ok


def test_percentile_interpolates_like_numpy() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 95) == pytest.approx(95.05)
    assert percentile([], 50) is None


def test_summary_counts_failures_and_skips_them_in_latencies() -> None:
    ok = RequestRecord(0, 0.0, sent_s=0.0, delta_s=[0.1, 0.5], done_s=0.6, output_tokens=5)
    bad = RequestRecord(1, 0.5, sent_s=0.5, error="HTTP 503")
    summary = summarize("S", "chat", 2.0, [ok, bad], drained=True, wall_s=2.0, cpu_s={})
    assert (summary.requests, summary.completed, summary.errors) == (2, 1, 1)
    assert summary.ttft_p50_ms == pytest.approx(100.0)
    assert summary.tpot_p50_ms == pytest.approx(100.0)
    assert summary.output_tokens_per_s == pytest.approx(2.5)


def test_poisson_arrivals_are_seeded_and_follow_the_rate() -> None:
    times = arrival_times([Phase(5.0, 200.0)], poisson=True, seed=3)
    assert times == arrival_times([Phase(5.0, 200.0)], poisson=True, seed=3)
    assert times != arrival_times([Phase(5.0, 200.0)], poisson=True, seed=4)
    assert all(b > a for a, b in itertools.pairwise(times))
    assert abs(len(times) / 200.0 - 5.0) < 0.5  # ~1,000 draws: well within 10 %


def test_constant_arrivals_and_a_ramp() -> None:
    phases = parse_ramp("1:3,0:2,2:1")
    assert phases == [Phase(1.0, 3.0), Phase(0.0, 2.0), Phase(2.0, 1.0)]
    assert arrival_times(phases, poisson=False, seed=0) == pytest.approx([1.0, 2.0, 5.5])


def test_shapes_fix_lengths_from_the_seed_ranges_scaled() -> None:
    assert output_range("reasoning", 1.0) == (2048, 8192)
    assert output_range("chat", 0.25) == (32, 128)
    tools = make_requests("tools", 20, model="m", length_scale=0.5, seed=1)
    assert tools == make_requests("tools", 20, model="m", length_scale=0.5, seed=1)
    for request in tools:
        assert 32 <= request.output_tokens <= 128
        assert request.body["max_tokens"] == request.output_tokens
        assert request.body["ignore_eos"] is True
        assert request.body["tools"][0]["function"]["name"] == "get_weather"
    reasoning = make_requests("reasoning", 1, model="m", length_scale=0.1, seed=1)[0]
    assert reasoning.body["messages"][0]["content"].startswith("think:")


def test_table_in_the_seed_format() -> None:
    cell = {
        "topology": "S", "shape": "chat", "rps": 2.0, "drained": True, "errors": 0,
        "ttft_p50_ms": 113.4, "ttft_p95_ms": 156.2, "tpot_p50_ms": 13.81, "tpot_p95_ms": 14.5,
    }  # fmt: skip
    assert cell_text(cell) == "113/156 \\| 13.81/14.50"
    assert cell_text({**cell, "drained": False}) == "did not drain"
    assert cell_text({**cell, "errors": 2}).endswith("(2 failed)")
    spec = {"topologies": ["G", "T", "S"], "shapes": ["chat", "tools"], "rps": [2.0]}
    table = markdown_table(spec, [{**cell, "topology": "T", "drained": False}, cell])
    lines = table.splitlines()
    # A topology the run never reached gets no column; a missing cell reads n/a.
    assert lines[0] == "| shape @ rps | T (inline text) | S (stateful tier) |"
    assert lines[2] == "| chat @2 | did not drain | 113/156 \\| 13.81/14.50 |"
    assert lines[3] == "| tools @2 | n/a | n/a |"


def test_cpu_per_1k_tokens_is_generate_and_all_tiers_over_the_cells_tokens() -> None:
    cell = {
        "topology": "S", "shape": "chat", "rps": 1.0, "wall_s": 20.0,
        "output_tokens_per_s": 100.0,  # 2,000 tokens
        "cpu_s": {"Generate": 6.0, "Derender": 1.0, "proxy": 1.0},
    }  # fmt: skip
    spec = {"topologies": ["S", "I"], "shapes": ["chat"], "rps": [1.0]}
    table = cpu_per_1k_table(spec, [cell, {**cell, "topology": "I", "output_tokens_per_s": 0}])
    assert table.splitlines()[2] == "| chat @1 | 3.0 / 4.0 | – |"


def _rung(rps: float, p95: bool, p50: bool | None = None) -> Rung:
    summary = CellSummary("I", "chat", rps, 1, 1, 0, True, 1.0, *[None] * 6, 0.0)
    return Rung("I", rps, summary, p95_ok=p95, p50_ok=p95 if p50 is None else p50)


def test_the_highest_sustained_rate_is_the_last_before_the_first_failure() -> None:
    idle = _rung(0.0, True)
    assert highest([idle, _rung(1, True), _rung(2, True), _rung(3, False)], "p95") == 2
    # A failed try followed by a sustained one (a retry) sustains the rate.
    retried = [idle, _rung(1, True), _rung(2, False), _rung(2, True), _rung(3, False)]
    assert highest([*retried, _rung(3, False)], "p95") == 2
    # A higher rate after one no try sustained does not count.
    assert highest([idle, _rung(1, False), _rung(2, True)], "p95") == 0
    assert highest([idle], "p95") == 0
    # Each criterion reads its own flags.
    split = [idle, _rung(1, True), _rung(2, False, True), _rung(3, False, True)]
    assert (highest(split, "p95"), highest(split, "p50")) == (1, 3)


def test_engine_busy_reads_the_graphs_gauge_or_else_vllms_own() -> None:
    vllm = [
        'vllm:num_requests_running{engine="0",model_name="m"} 0.0',
        'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0',
        'vllm:num_requests_running_total{engine="0"} 9.0',
    ]
    assert engine_busy("\n".join(vllm)) == [0.0, 1.0]
    # The graph's /metrics carries vLLM's gauges too; its own gauge per engine wins.
    graph = ['scaleout_engine_unfinished_requests{replica="a"} 2.0', *vllm]
    assert engine_busy("\n".join(graph)) == [2.0]
    assert engine_busy("") == []


@pytest.mark.parametrize("topology", ["G", "BP", "S"])
def test_gpu_profile_is_the_gpu_config_with_the_topology_switches(topology: str) -> None:
    local = topology_config(topology, 1234, Overrides())["applications"][0]["args"]
    config = topology_config(topology, 1234, Overrides(profile="gpu", kv_cache_gib=4))
    args = config["applications"][0]["args"]
    assert config["http_options"]["port"] == 1234
    assert args["model"] == "Qwen/Qwen3-8B" and args["num_gpus"] == 1
    for switch in ("tokens_only", "text_placement", "reasoning_parser", "tool_call_parser"):
        assert args.get(switch) == local.get(switch), switch
    assert GraphConfig.from_args(args).kv_cache_gib == 4


def test_set_args_nest_over_the_config() -> None:
    config = topology_config("S", 1234, Overrides(args={"derender.num_cpus": "0.2"}))
    derender = config["applications"][0]["args"]["derender"]
    assert derender["num_cpus"] == "0.2"
    assert derender["autoscaling"]["max_replicas"] == 3  # the config's own, kept
    assert GraphConfig.from_args(config["applications"][0]["args"]).derender.num_cpus == 0.2


def test_topologies_side_by_side_are_each_files_application_under_its_name() -> None:
    overrides = Overrides(kv_cache_gib=1, args={"enforce_eager": "true"})
    config = topologies_config(["I", "BP", "S"], 1234, overrides)
    assert config["http_options"]["port"] == 1234
    apps = {app["name"]: app for app in config["applications"]}
    assert list(apps) == ["i", "bp", "s"]
    for name, app in apps.items():
        alone = topology_config(name.upper(), 1234, overrides)["applications"][0]
        assert app["route_prefix"] == f"/{name}"
        assert app["args"] == alone["args"] and app["import_path"] == alone["import_path"]
    assert apps["bp"]["args"] != apps["s"]["args"]


def test_topologies_that_differ_outside_their_application_do_not_share_a_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = bench.topology.topology_config

    def other_proxy(name: str, port: int, overrides: Overrides) -> dict[str, Any]:
        config = real(name, port, overrides)
        return {**config, "proxy_location": "EveryNode"} if name == "S" else config

    monkeypatch.setattr(bench.topology, "topology_config", other_proxy)
    with pytest.raises(ValueError, match=r"S\.yaml differs"):
        topologies_config(["I", "S"], 1234, Overrides())


def test_running_requests_reads_the_gauge_per_replica() -> None:
    text = (
        "# TYPE scaleout_engine_unfinished_requests gauge\n"
        'scaleout_engine_unfinished_requests{replica="a1"} 2.0\n'
        'scaleout_engine_unfinished_requests{replica="b2"} 0.0\n'
        'vllm:num_requests_running{engine="0",model_name="m",replica="a1"} 1.0\n'
    )
    assert running_requests(text) == {"a1": 2, "b2": 0}
    assert running_requests("# TYPE scaleout_engine_unfinished_requests gauge\n") == {}


def test_engine_steps_sums_the_step_histogram_count_over_engines() -> None:
    text = (
        "# TYPE vllm:iteration_tokens_total histogram\n"
        'vllm:iteration_tokens_total_bucket{engine="0",le="1.0",replica="a1"} 3.0\n'
        'vllm:iteration_tokens_total_count{engine="0",model_name="m",replica="a1"} 120.0\n'
        'vllm:iteration_tokens_total_sum{engine="0",model_name="m",replica="a1"} 900.0\n'
        'vllm:iteration_tokens_total_count{engine="0",model_name="m",replica="b2"} 30.0\n'
    )
    assert engine_steps(text) == 150.0
    assert engine_steps("vllm:iteration_tokens_total_count 7.0\n") == 7.0
    assert engine_steps("") == 0.0


def test_every_topology_has_a_bench_client() -> None:
    assert list(CLIENTS) == list(TOPOLOGIES)


def test_routing_bench_reads_the_engines_prefix_counters_and_turn_placement() -> None:
    from bench.routing.results import Result, Turn
    from bench.routing.study import prefix_counters

    metrics = "\n".join(
        [
            "# HELP vllm:prefix_cache_hits_total Prefix cache hits",
            'vllm:prefix_cache_hits_total{engine="0",replica="a"} 30.0',
            'vllm:prefix_cache_hits_total{engine="0",replica="b"} 10.0',
            'vllm:prefix_cache_queries_total{engine="0",replica="a"} 50.0',
            'vllm:prefix_cache_queries_total{engine="0",replica="b"} 50.0',
            'vllm:prefix_cache_hits_created{engine="0",replica="a"} 1.7e9',
            'vllm:external_prefix_cache_hits_total{engine="0",replica="a"} 99.0',
        ]
    )
    assert prefix_counters(metrics) == (40.0, 100.0)
    result = Result("prefix", "shared", hits=40.0, queries=100.0)
    result.turns = [
        Turn(1, 0, 0.0, 100.0, "a"),
        Turn(1, 1, 1.0, 50.0, "a"),
        Turn(2, 0, 0.0, 90.0, "b"),
        Turn(2, 1, 1.0, 80.0, "a"),
    ]
    assert result.hit_rate == 0.4
    assert result.stayed() == 0.5
    assert result.per_replica() == [3, 1]
    from bench.routing.report import rows

    # First turns 100 and 90 ms, later turns 50 and 80 ms.
    assert rows([result])[-1].endswith("| 95 / 65 |")


def test_the_reproducing_command_names_only_what_changed() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ramp", default="1:10")
    parser.add_argument("--soak-minutes", type=float, default=20)
    parser.add_argument("--work", default="/tmp/w")
    parser.add_argument("--out", default="docs/x.md")
    parser.add_argument("--heavy", action="store_true")
    args = parser.parse_args(["--soak-minutes", "5", "--work", "/tmp/elsewhere", "--heavy"])
    args.host = "not an option"
    assert reproducing_command("bench.x", parser, args) == (
        "python -m bench.x --soak-minutes 5.0 --heavy --out docs/x.md"
    )


def test_prefill_model_has_the_embedded_tokenizer_and_factor_times_its_layer_weights(
    tmp_path: Path,
) -> None:
    import json

    from safetensors import safe_open

    from bench.harness.servers import TINY_MODEL
    from bench.prefill_model import FACTOR, TOKENIZER_FILES, build

    out = build(tmp_path / "m")

    def layer_weights(model: Path) -> int:
        with safe_open(str(model / "model.safetensors"), "pt") as f:
            return sum(
                f.get_slice(k).get_shape()[0] * f.get_slice(k).get_shape()[-1]
                for k in f.keys()  # noqa: SIM118 (safe_open has no __iter__)
                if ".layers." in k and k.endswith("proj.weight")
            )

    assert layer_weights(out) == FACTOR * layer_weights(TINY_MODEL)
    for name in TOKENIZER_FILES:
        assert (out / name).read_bytes() == (TINY_MODEL / name).read_bytes(), name
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["head_dim"] >= 32
    # Greedy answers are plain text: special and padding rows never win.
    added = json.loads((TINY_MODEL / "tokenizer.json").read_text())["added_tokens"]
    special = min(token["id"] for token in added)
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        embeddings = f.get_tensor("model.embed_tokens.weight")
    assert not embeddings[special:].any() and embeddings[:special].abs().sum(dim=1).all()
