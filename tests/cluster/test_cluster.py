"""The graph on a multi-node Ray cluster: placement by node group, the Ray
autoscaler adding and removing CPU nodes as Serve scales Derender, and faults
with every request accounted for."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from bench.arrivals import Phase
from bench.harness.cluster import LocalCluster
from bench.harness.cluster_load import (
    TIER,
    OpenLoop,
    Timeline,
    chat_body,
    engine_requests,
    outcome,
)
from bench.harness.cluster_shape import HEAD_GROUP
from bench.harness.kustomize import SHARED_HOST_DERENDER_CORES
from bench.harness.sse_reader import Stream
from deployments.config.graph_config import CPU_POLICY
from tests.cluster.conftest import AFTER_LOSS_S, FULL, ClusterGraph

ENGINE_GROUP = "engine"
CPU_GROUP = "cpu-text"
# An explicit error reaches a client within this of the failure (issue 15).
ERROR_WITHIN_S = 5.0
# A probe stream's tokens: far more than an engine makes in the time a node's loss takes
# to reach its replicas; at most MAX_PROBES of them at a time, one more a second.
PROBE_TOKENS = 3000
MAX_PROBES = 6
CPU_TIERS = ("Render", "Derender")
# Past a fresh replica's first CPU report (Serve records Render's every 6 s, Derender's
# every 2.2 s here, and pushes them every 10 s) and the 2 s upscale delay after it.
IDLE_WATCH_S = 25.0
T = TypeVar("T")


def wait_for(
    what: str, check: Callable[[], T | None], timeout_s: float, cluster: LocalCluster
) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = check()
        except Exception:  # the state API mid-failure: ask again
            value = None
        if value:
            waited = time.monotonic() - deadline + timeout_s
            print(f"{what}: after {waited:.1f} s", flush=True)  # where the time goes, with -s
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout_s}s\n{cluster.log_tail()}")
        time.sleep(1)


def exit_times(pids: dict[str, int], timeout_s: float) -> dict[str, float]:
    """When each process exited (monotonic), watched every 0.1 s."""
    exited: dict[str, float] = {}
    deadline = time.monotonic() + timeout_s
    while len(exited) < len(pids) and time.monotonic() < deadline:
        for name, pid in pids.items():
            if name not in exited and not psutil.pid_exists(pid):
                exited[name] = time.monotonic()
        time.sleep(0.1)
    assert len(exited) == len(pids), f"still running after {timeout_s}s: {set(pids) - set(exited)}"
    return exited


def hang_up(streams: list[Stream]) -> None:
    """Drop every stream still running, as a client that leaves."""
    for stream in streams:
        if not stream.ended_at:
            stream.kill()


def group_of(cluster: LocalCluster) -> dict[str, str]:
    return {n["node_id"]: n["group"] for n in cluster.nodes()}


def test_the_graph_is_placed_by_node_group(cluster_graph: ClusterGraph) -> None:
    cluster = cluster_graph.cluster
    groups = group_of(cluster)
    assert HEAD_GROUP in groups.values(), groups
    placed: dict[str, set[str]] = {}
    for replica in cluster.replicas():
        placed.setdefault(replica["deployment"], set()).add(groups[replica["node_id"]])
    assert set(placed) == {"Ingress", "Render", "Generate", "Derender", "AbortFanout"}, placed
    assert all(HEAD_GROUP not in where for where in placed.values()), placed
    assert placed.pop("Generate") == {ENGINE_GROUP}
    assert all(where == {CPU_GROUP} for where in placed.values()), placed
    # And it serves: one streamed chat through every tier.
    stream = Stream(cluster_graph.base_url, "/v1/chat/completions",
                    chat_body(cluster_graph.model, 16, 0), TIER)  # fmt: skip
    stream.start()
    stream.join(120)
    assert outcome(stream) == "ok", stream.events[-3:]


def test_serve_runs_the_cpu_tiers_on_the_overlays_cpu_policy(cluster_graph: ClusterGraph) -> None:
    """What the ramp below scales on: Render and Derender on the CPU policy, as Serve's
    controller runs them (a policy it could not load would have failed the deploy)."""
    (app,) = cluster_graph.cluster.serve_applications().values()
    assert app["status"] == "RUNNING"
    for name in CPU_TIERS:
        deployment = app["deployments"][name]
        assert deployment["status"] == "HEALTHY"
        policy = deployment["deployment_config"]["autoscaling_config"]["policy"]
        assert policy["policy_function"] == CPU_POLICY, policy
    derender = app["deployments"]["Derender"]["deployment_config"]["autoscaling_config"]
    assert derender["policy"]["policy_kwargs"]["cores_per_replica"] == SHARED_HOST_DERENDER_CORES


def test_an_idle_graph_stays_at_its_minimum(cluster_graph: ClusterGraph) -> None:
    """No load, no scale-out: Render's and Derender's targets stay at their minimum past
    their replicas' first CPU reports and Serve's decision on them. A replica that
    counted its own start-up as load would scale its tier out here."""
    cluster = cluster_graph.cluster
    targets: dict[str, set[int]] = {name: set() for name in CPU_TIERS}
    minimum: dict[str, int] = {}
    deadline = time.monotonic() + IDLE_WATCH_S
    while time.monotonic() < deadline:
        (app,) = cluster.serve_applications().values()
        for name in CPU_TIERS:
            deployment = app["deployments"][name]
            minimum[name] = deployment["deployment_config"]["autoscaling_config"]["min_replicas"]
            targets[name].add(deployment["target_num_replicas"])
        time.sleep(1)
    assert targets == {name: {minimum[name]} for name in CPU_TIERS}, (targets, minimum)


def test_autoscaler_adds_a_cpu_node_for_derender_survives_losing_it_and_removes_it(
    cluster_graph: ClusterGraph, tmp_path: Path
) -> None:
    """Ramp → Serve scales Derender on its CPU (the overlay's policy) past what the CPU
    node fits → the autoscaler adds a node and a Derender replica there serves. Its
    raylet is killed mid-stream: its streams end with an error event and [DONE] within
    5 s, the rest finish, requests after the loss succeed. After the load, Derender
    scales in and the node goes."""
    cluster = cluster_graph.cluster
    base_url = cluster_graph.base_url
    (min_cpu_nodes,) = (g.min_nodes for g in cluster.shape.groups if g.name == CPU_GROUP)
    # From the group's minimum: nodes an earlier test left come and go on their own.
    wait_for("the CPU group at its minimum",
             lambda: cluster.groups().get(CPU_GROUP) == min_cpu_nodes, 120, cluster)  # fmt: skip
    first_nodes = {n["node_id"] for n in cluster.nodes() if n["group"] == CPU_GROUP}
    timeline = Timeline(cluster)
    load = OpenLoop(base_url, cluster_graph.model, [Phase(3.0, 180.0)], max_tokens=256)
    probes: list[Stream] = []
    left: list[Stream] = []  # probes this test hung up on
    timeline.start()
    load.start()
    try:
        # 1. A new CPU node, a Derender replica on it, and a stream it serves.
        def serving_on_a_new_node() -> str | None:
            groups = group_of(cluster)
            new = {
                r["node_id"]: r["replica"]
                for r in cluster.replicas()
                if r["deployment"] == "Derender"
                and groups.get(r["node_id"]) == CPU_GROUP
                and r["node_id"] not in first_nodes
            }
            served = {s.stream.headers.get("x-served-by") for s in load.sent}
            return next((n for n, replica in new.items() if replica in served), None)

        node_id = wait_for(
            "a Derender replica serving on an added CPU node", serving_on_a_new_node, 300, cluster
        )

        # 2. Kill that node's raylet while a long stream it serves is mid-way. Its
        # replicas' processes outlive it until Ray declares the node dead (~17 s with its
        # default health checks, ~6 s in the reduced form: tests/cluster/conftest.py) and
        # serve on meanwhile; from each one's exit, its streams have 5 s to end explicitly.
        # The load's streams may all finish before that exit (two CI runs cut none), so
        # probes far longer than it are sent until one is served there.
        def long_stream_there() -> Stream | None:
            # The node's replicas now: Derender may have scaled out onto it since.
            there = {r["replica"] for r in cluster.replicas() if r["node_id"] == node_id}
            for probe in probes:
                served_by = probe.headers.get("x-served-by")
                if served_by in there and len(probe.events) > 2 and not probe.ended_at:
                    return probe
                if served_by and served_by not in there and not probe.ended_at:
                    probe.kill()  # served elsewhere: its slot goes to the next probe
                    left.append(probe)
            if sum(not p.ended_at for p in probes) < MAX_PROBES:
                body = chat_body(cluster_graph.model, PROBE_TOKENS, len(probes))
                probe = Stream(base_url, "/v1/chat/completions", body, TIER)
                probe.start()
                probes.append(probe)
            return None

        wait_for("a long stream mid-way on the added node", long_stream_there, 120, cluster)
        pids = {r["replica"]: r["pid"] for r in cluster.replicas() if r["node_id"] == node_id}
        raylet = cluster.raylet(node_id)
        killed_at = time.monotonic()
        raylet.send_signal(signal.SIGKILL)
        exited = exit_times(pids, timeout_s=120)
        lost = [
            s
            for s in [*(sent.stream for sent in load.sent), *probes]
            if s.headers.get("x-served-by") in exited and s not in left
        ]
        for stream in lost:
            stream.join(max(0.0, exited[stream.headers["x-served-by"]] + 10 - time.monotonic()))
        cut = []  # seconds from a replica's exit to the error event of a stream it served
        for stream in lost:
            got = outcome(stream)
            assert got in ("ok", "error event"), (got, stream.events[-3:])
            if got == "error event":
                cut.append(stream.ended_at - exited[stream.headers["x-served-by"]])
        probes_lost = [p for p in probes if p in lost]
        assert probes_lost and all(outcome(p) == "error event" for p in probes_lost), [
            (outcome(p), len(p.events)) for p in probes_lost
        ]
        assert max(cut) <= ERROR_WITHIN_S, sorted(cut)[-3:]
        after_kill = [round(t - killed_at, 1) for t in exited.values()]
        print(f"raylet killed; its replicas exited after {after_kill} s; {len(cut)} streams cut, ")
        print(f"each with an error event and [DONE] within {max(cut):.2f} s of the exit")

        # 3. The rest of the load: every stream ends, none broken. The load goes on
        # until AFTER_LOSS_S of requests have been sent past the loss's settling time
        # (what the last check reads), then stops sending.
        settled = max(exited.values())
        wait_for(
            "requests sent well after the loss",
            lambda: (
                time.monotonic() > settled + AFTER_LOSS_S
                and sum(s.sent_at - settled > 15 for s in load.sent) >= 10
            ),
            AFTER_LOSS_S + 120,
            cluster,
        )
        load.stop()
        hang_up(probes)  # the rest of the probes: a client that leaves frees its slot
        load.join(400)
        outcomes = [(s.sent_at - settled, outcome(s.stream)) for s in load.sent]
        assert all(o in ("ok", "error event") for _, o in outcomes), [
            o for o in outcomes if o[1] not in ("ok", "error event")
        ][:5]
        # Serve routes around the dead replicas once it hears of them; then all succeed.
        after = [o for t, o in outcomes if t > 15]
        assert after and all(o == "ok" for o in after), after
        assert wait_for(
            "engines holding no request", lambda: engine_requests(base_url) == 0 or None,
            60, cluster,
        )  # fmt: skip

        # 4. Load gone: Derender back to its minimum, the extra CPU nodes removed.
        def scaled_in() -> bool:
            derender = [r for r in cluster.replicas() if r["deployment"] == "Derender"]
            return len(derender) == 1 and cluster.groups().get(CPU_GROUP) == min_cpu_nodes

        wait_for("Derender and the CPU nodes scaled in", scaled_in, 300, cluster)
    finally:
        load.stop()
        hang_up(probes)
        timeline.stop()
        (tmp_path / "timeline.json").write_text(
            json.dumps([s.__dict__ for s in timeline.samples], indent=1)
        )
    peak_nodes = max(s.nodes.get(CPU_GROUP, 0) for s in timeline.samples)
    assert peak_nodes > min_cpu_nodes


def test_the_data_plane_answers_while_the_serve_controller_restarts(
    cluster_graph: ClusterGraph,
) -> None:
    """And the new controller keeps every replica it finds (it recovers them): a Generate
    replica whose log handler vLLM had closed used to fail recovery and be replaced."""
    cluster, base_url = cluster_graph.cluster, cluster_graph.base_url
    replicas = {(r["deployment"], r["replica"]) for r in cluster.replicas()}
    before = cluster.controller()
    os.kill(before["pid"], signal.SIGKILL)
    killed_at = time.monotonic()
    answered: list[str] = []
    answered_after_restart = 0  # chats answered once a new controller was running
    while time.monotonic() - killed_at < 30 and answered_after_restart < 3:
        stream = Stream(base_url, "/v1/chat/completions",
                        chat_body(cluster_graph.model, 8, 0), TIER)  # fmt: skip
        stream.start()
        stream.join(60)
        answered.append(outcome(stream))
        if answered_after_restart or _new_controller(cluster, before["pid"]):
            answered_after_restart += 1
    assert answered and all(o == "ok" for o in answered), answered
    after = wait_for("a new Serve controller", cluster.controller, 120, cluster)
    assert after["pid"] != before["pid"]
    assert {(r["deployment"], r["replica"]) for r in cluster.replicas()} == replicas


def _new_controller(cluster: LocalCluster, old_pid: int) -> bool:
    try:
        controller = cluster.controller()
    except Exception:  # the state API mid-restart: not yet
        return False
    return bool(controller) and controller["pid"] != old_pid


@pytest.mark.skipif(not FULL, reason="full cluster run only (SCALEOUT_CLUSTER_FULL=1)")
def test_killing_the_generate_replica_ends_its_streams_and_serve_replaces_it(
    cluster_graph: ClusterGraph,
) -> None:
    cluster, base_url = cluster_graph.cluster, cluster_graph.base_url
    (generate,) = [r for r in cluster.replicas() if r["deployment"] == "Generate"]
    engine = [p for p in psutil.Process(generate["pid"]).children(recursive=True)]
    streams = [
        Stream(base_url, "/v1/chat/completions", chat_body(cluster_graph.model, 2048, i), TIER)
        for i in range(4)
    ]
    for stream in streams:
        stream.start()
    for stream in streams:
        assert stream.wait_first(60)
    killed_at = time.monotonic()
    os.kill(generate["pid"], signal.SIGKILL)
    for stream in streams:
        stream.join(ERROR_WITHIN_S + 5)
        assert outcome(stream) == "error event", stream.events[-3:]
        assert stream.ended_at - killed_at <= ERROR_WITHIN_S
    # Its engine does not outlive it, and Serve starts another on the engine node.
    psutil.wait_procs(engine, timeout=30)
    assert not [p for p in engine if p.is_running()]

    def replaced() -> dict[str, Any] | None:
        new = [r for r in cluster.replicas() if r["deployment"] == "Generate"]
        return new[0] if new and new[0]["replica"] != generate["replica"] else None

    new = wait_for("a new Generate replica", replaced, 300, cluster)
    assert group_of(cluster)[new["node_id"]] == ENGINE_GROUP

    def serves() -> bool:
        stream = Stream(base_url, "/v1/chat/completions",
                        chat_body(cluster_graph.model, 8, 0), TIER)  # fmt: skip
        stream.start()
        stream.join(60)
        return outcome(stream) == "ok"

    wait_for("a chat served by the new engine", serves, 300, cluster)
