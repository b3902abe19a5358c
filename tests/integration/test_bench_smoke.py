"""The experiment harness, one short cell per client type, on the session graph.

``python -m bench run --url`` drives every topology's client against the one
graph (it serves tokens, text, per-chunk derender and both placements), then
the outputs are read back: rows present, numbers finite, plots written.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import psutil

from bench.harness.servers import GRAPH_ENGINE_THREADS, REPO, TINY_MODEL, Server
from bench.requests import engine_view
from bench.requests.load import ShortChats
from bench.requests.processes import ENGINE, memory_by_kind, snapshot
from bench.requests.study import measure_cell

TOPOLOGIES = ["G", "T", "B", "BP", "S", "I"]


def test_harness_runs_one_cell_per_client_type(graph: Server, tmp_path: Path) -> None:
    out = tmp_path / "results"
    argv = [
        sys.executable, "-m", "bench", "run", "--url", graph.base_url,
        "--topologies", ",".join(TOPOLOGIES), "--shapes", "chat", "--rps", "2",
        "--duration", "1.5", "--length-scale", "0.1", "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    cells = json.loads((out / "cells.json").read_text())
    assert [c["topology"] for c in cells] == TOPOLOGIES
    for cell in cells:
        assert cell["requests"] > 0 and cell["completed"] == cell["requests"], cell
        assert cell["errors"] == 0 and cell["drained"], cell
        for key in ("ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms", "tpot_p95_ms", "e2e_p50_ms"):
            assert cell[key] is not None and math.isfinite(cell[key]) and cell[key] >= 0, cell
        assert cell["output_tokens_per_s"] > 0
        assert cell["cpu_s"].get("Generate", 0) > 0, cell["cpu_s"]

    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == sum(c["requests"] for c in cells)
    for row in rows:
        # Every request ran to its fixed length (max_tokens + ignore_eos).
        assert row["error"] is None and row["output_tokens"] >= 13, row
        assert row["ttft_ms"] <= row["e2e_ms"]

    table = (out / "table.md").read_text()
    header = table.splitlines()[2]
    assert header.startswith("| shape @ rps | G (gen only) | T (inline text)"), header
    assert "| chat @2 |" in table and "did not drain" not in table
    timeline = json.loads((out / "timeline.json").read_text())
    samples = [s for run in timeline["samples"] for s in next(iter(run.values()))]
    assert samples and all(s.get("Generate") == 2 for s in samples)
    for name in ("latency.png", "replicas.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "cells.csv").read_text().count("\n") == len(TOPOLOGIES) + 1


def test_request_bench_reads_a_cell_and_memory_by_process(graph: Server) -> None:
    """``python -m bench.requests``'s cell on the session graph: every request timed,
    the CPU it took read from the graph's process tree by kind, HAProxy among them,
    and what vLLM's metrics (the graph's ``/metrics``) counted in its engine."""
    cell = measure_cell(graph, "graph", ShortChats(model=str(TINY_MODEL)), "inline", 2, 6)
    assert cell.requests == 6 and cell.wall_s > 0
    assert all(0 < t <= e for t, e in zip(cell.ttft_ms, cell.e2e_ms, strict=True))
    for kind in ("Ingress", "Render", "Generate", ENGINE):
        assert cell.cpu_s.get(kind, 0) > 0, (kind, cell.cpu_s)
    assert "haproxy" in cell.cpu_s and "proxy" in cell.cpu_s, cell.cpu_s
    # vLLM records a request's end before its stream's last output reaches the caller.
    assert cell.engine[f"{engine_view.E2E}_count"] == 6, cell.engine
    in_engine = engine_view.in_engine(cell.engine, cell.requests / cell.wall_s)
    assert in_engine is not None and 0 < in_engine <= 2, cell.engine
    assert (engine_view.tokens_per_step(cell.engine) or 0) >= 1, cell.engine
    memory = memory_by_kind(snapshot(graph.process.pid, memory=True))
    assert memory["Ingress"].processes >= 1 and memory["Ingress"].rss_mib > 100
    assert memory["haproxy"].processes == 1


def test_vllms_server_runs_the_graphs_engine_threads(vllm_server: Server) -> None:
    """Every comparison with vLLM's server (the benches, the parity oracle) runs the
    graph's engine: as many OpenMP threads as Ray gives Generate's engine (its
    ``OMP_NUM_THREADS``, read when vLLM's CPU worker starts; the engines' own
    environments cannot be read back, vLLM's process titles overwrite them)."""
    root = psutil.Process(vllm_server.process.pid)
    assert root.environ().get("OMP_NUM_THREADS") == GRAPH_ENGINE_THREADS
