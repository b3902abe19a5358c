"""A Generate replica that Serve stops, by a scale-in or a redeploy, hands its streams
over to the replicas that stay, and no client sees it (``EngineCalls.leave``); a
Derender replica that Serve stops finishes its streams and then leaves at once
(``transport/leaving.py``).

Serve gives a stopping replica ``graceful_shutdown_timeout_s`` (5 s for Generate)
and then kills it: a stream longer than that used to be cut. Both changes are made
as KubeRay and ``serve deploy`` make them, by a PUT of the graph's config to the Ray
dashboard's Serve API, with a ``deployments`` override for Generate: a scale-in
(``num_replicas``, which Serve applies in place) and a redeploy
(``ray_actor_options``, which restarts every replica, a new one up before an old
one goes).
"""

from __future__ import annotations

import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bench.harness.servers import Server
from bench.harness.sse_reader import Stream
from deployments.config.graph_config import GraphConfig
from deployments.declarations.generate import engine_env
from tests.integration.test_failure_semantics import HANG_GUARD_S, running_requests
from tests.integration.test_generate_loss import (
    KILL_AFTER,
    assert_whole,
    moving_bodies,
    token_ids,
    unary_tokens,
    wait_all_back,
)

# The streams must outlast what Serve takes to act on a deploy: with both CPU engines
# busy (they spin while they have work) `serve deploy` took 33 s to scale in here
# (76 s the first time, the dashboard's Serve API cold), 3 s idle; so the test warms
# the API and PUTs the config itself. A redeploy stops the old replica only once a
# new one is up (an engine start). At a 20 ms pace a step took ~13 ms more under load.
# A run here: the scale-in 1 s after the PUT, ~8 s into the streams; the redeploy's
# old replica stopped 54 s after its PUT, ~62 s into streams that ran ~2 minutes.
SCALE_IN_TOKENS, SCALE_IN_PACE_MS = 1000, 30
ROLLOUT_TOKENS, ROLLOUT_PACE_MS = 1800, 45
DEPLOYED_WITHIN_S = 300
LEAVING = re.compile(
    r"replica (?P<replica>\S+) is being stopped: moving its (?P<calls>\d+) streams"
)
DERENDER_LEAVING = re.compile(
    r"replica (?P<replica>\S+) is being stopped: finishing its (?P<calls>\d+) streams"
)
MOVED = re.compile(
    r"request (?P<request>\S+): its Generate replica was lost \(ReplicaLeavingError\)"
)
# A unary inline call is made again by the Ingress's retry before a first item.
RETRIED = "Generate replica lost before the first item (ReplicaLeavingError("
SERVE_API = "/api/serve/applications/"  # what `serve deploy` and KubeRay call
DASHBOARD = re.compile(r"View the dashboard at \S*?(?P<url>http://[\d.]+:\d+)")


def test_a_scale_in_and_a_redeploy_of_generate_lose_no_stream(
    graph: Server, client: httpx.Client
) -> None:
    """1. Scale-in, 2 → 1, under ten greedy streams (two each of inline and tier chat
       and ``output_mode`` derender, tokens and text) spread over both replicas, and a
       unary request of each kind: every one completes whole, the stopped replica's by moving.
       Derender is scaled in 2 → 1 at the same time: its stopped replica finishes its
       streams, then leaves at once, not when Serve's grace period runs out.
    2. Redeploy of Generate (a changed ``ray_actor_options``: every replica
       restarts) back to 2, under ten more on the one replica left: all ten move
       when it goes, and complete whole."""
    if graph.process is None:
        pytest.skip("redeploys the graph this session started (its config and log)")
    dashboard = _dashboard(graph)
    assert dashboard.get(SERVE_API).status_code == 200  # warm: its first call is slow
    log_start = graph.log_path.stat().st_size
    before = set(running_requests(client))
    assert len(before) == 2, before

    # 1. Scale-in. Each pair of streams has a prompt of its own, so the prefix router
    # spreads them by load over both replicas.
    prompts, streams = _streams(client, range(2), SCALE_IN_TOKENS, SCALE_IN_PACE_MS)
    kinds = ("tokens", "text", "derender", "tier", "inline")
    with ThreadPoolExecutor(len(kinds)) as pool:
        unary = [pool.submit(_unary, client, kind) for kind in kinds]
        _wait_tokens(streams, KILL_AFTER)
        busy = {replica for replica, running in running_requests(client).items() if running}
        assert busy == before, ("the streams did not spread over both replicas", busy)
        _serve_deploy(
            graph, dashboard, {"Generate": {"num_replicas": 1}, "Derender": {"num_replicas": 1}}
        )
        _wait_replicas(client, lambda replicas: len(replicas) == 1)
        for kind, stream in streams:
            stream.join(DEPLOYED_WITHIN_S)
            assert_whole(kind, stream, len(prompts[stream]), SCALE_IN_TOKENS)
        for answer in (u.result(DEPLOYED_WITHIN_S) for u in unary):
            assert answer == SCALE_IN_TOKENS
    left = _leaving(graph, log_start)
    assert len(left) == 1 and left[0][0] in before and left[0][1] >= 1, left
    # Each call it held was made again elsewhere, and maybe calls it refused as it left.
    retried = _log_since(graph, log_start).count(RETRIED)
    assert len(_moved(graph, log_start)) + retried >= left[0][1]
    # The Derender replica held streams (their text state is there) until they ended.
    (derender, held), *more = _leaving(graph, log_start, DERENDER_LEAVING)
    assert not more and held >= 1, (derender, held, more)
    stopped = f"Replica(id='{derender}', deployment='Derender', app='default') is stopped"
    deadline = time.monotonic() + HANG_GUARD_S
    while stopped not in _log_since(graph, log_start):
        assert time.monotonic() < deadline, f"Derender replica {derender} did not leave"
        time.sleep(0.5)
    assert f"Replica(id='{derender}', deployment='Derender', app='default') did not " not in (
        _log_since(graph, log_start)
    )

    # 2. Redeploy, under streams on the one replica left.
    (old,) = set(running_requests(client))
    log_start = graph.log_path.stat().st_size
    prompts, streams = _streams(client, range(2, 4), ROLLOUT_TOKENS, ROLLOUT_PACE_MS)
    _wait_tokens(streams, KILL_AFTER)
    config = GraphConfig.from_args(_app_config(graph)["args"])
    env = {**engine_env(config), "SCALEOUT_TEST_ROLLOUT": uuid.uuid4().hex}
    actor = {"num_cpus": config.generate.num_cpus, "runtime_env": {"env_vars": env}}
    _serve_deploy(
        graph,
        dashboard,
        {
            "Generate": {"num_replicas": 2, "ray_actor_options": actor},
            "Derender": {"num_replicas": 2},
        },
    )
    _wait_replicas(client, lambda replicas: len(replicas) == 2 and old not in replicas)
    for kind, stream in streams:
        stream.join(DEPLOYED_WITHIN_S)
        assert_whole(kind, stream, len(prompts[stream]), ROLLOUT_TOKENS)
    # Fewer than ten: the streams ended before the redeploy stopped their replica
    # (a host slower to start an engine than ROLLOUT_TOKENS last).
    assert _leaving(graph, log_start) == [(old, len(streams))]
    moved = _moved(graph, log_start)
    assert all(any(r in stream.stream_id for r in moved) for _, stream in streams), moved
    wait_all_back(client, 2)


def _streams(
    client: httpx.Client, variants: range, tokens: int, pace_ms: float
) -> tuple[dict[Stream, list[int]], list[tuple[str, Stream]]]:
    """Started greedy streams, every kind once per prompt variant; each one's prompt."""
    prompts: dict[Stream, list[int]] = {}
    streams: list[tuple[str, Stream]] = []
    for variant in variants:
        system = [{"role": "system", "content": f"You are stream {variant}."}]
        prompt, bodies = moving_bodies(client, system, tokens, pace_ms)
        for kind, body in bodies.items():
            stream = Stream(str(client.base_url), *body)
            stream.start()
            prompts[stream] = prompt
            streams.append((kind, stream))
    return prompts, streams


def _unary(client: httpx.Client, kind: str) -> int:
    """A unary request of SCALE_IN_TOKENS paced tokens; the tokens it returned."""
    _, bodies = moving_bodies(client, [], SCALE_IN_TOKENS, SCALE_IN_PACE_MS)
    return unary_tokens(client, *bodies[f"{kind} chat" if kind in ("tier", "inline") else kind])


def _wait_tokens(streams: list[tuple[str, Stream]], tokens: int) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not all(len(token_ids(s)) >= tokens for _, s in streams):
        assert time.monotonic() < deadline, [(k, len(token_ids(s)), s.error) for k, s in streams]
        assert not any(s.ended_at for _, s in streams), "a stream ended early"
        time.sleep(0.05)


def _wait_replicas(client: httpx.Client, done: Any) -> None:
    """Until the Generate replicas /metrics lists satisfy ``done``."""
    deadline = time.monotonic() + DEPLOYED_WITHIN_S
    while not done(set(running_requests(client))):
        assert time.monotonic() < deadline, running_requests(client)
        time.sleep(0.5)


def _app_config(graph: Server) -> dict[str, Any]:
    config = yaml.safe_load(_config_path(graph).read_text())
    app: dict[str, Any] = next(a for a in config["applications"] if a["name"] == "default")
    return app


def _config_path(graph: Server) -> Path:
    return graph.log_path.parent / "serve.yaml"  # bench.harness.servers.running_graph


def _dashboard(graph: Server) -> httpx.Client:
    """The dashboard of the Ray instance ``serve run`` started. Ray 2.60 guards its REST
    API with the token it wrote to ``~/.ray/auth_token`` (``serve deploy`` sends it
    when run with ``RAY_AUTH_MODE=token``)."""
    found = DASHBOARD.search(graph.log_path.read_text(errors="replace"))
    assert found, "serve run did not say where its dashboard is"
    token = (Path.home() / ".ray" / "auth_token").read_text().strip()
    return httpx.Client(
        base_url=found["url"], headers={"Authorization": f"Bearer {token}"}, timeout=120
    )


def _serve_deploy(
    graph: Server, dashboard: httpx.Client, options: dict[str, dict[str, Any]]
) -> None:
    """``serve deploy`` of the graph's config with these options by deployment name."""
    config = yaml.safe_load(_config_path(graph).read_text())
    for app in config["applications"]:
        if app["name"] == "default":
            app["deployments"] = [{"name": name, **opts} for name, opts in options.items()]
    deployed = dashboard.put(SERVE_API, json=config)
    assert deployed.status_code == 200, deployed.text


def _log_since(graph: Server, start: int) -> str:
    with graph.log_path.open("rb") as log:
        log.seek(start)
        return log.read().decode(errors="replace")


def _leaving(graph: Server, start: int, line: re.Pattern[str] = LEAVING) -> list[tuple[str, int]]:
    """(replica, calls it held) of each Generate (``line``'s) replica stopped since ``start``."""
    found = line.finditer(_log_since(graph, start))
    return [(m["replica"], int(m["calls"])) for m in found]


def _moved(graph: Server, start: int) -> list[str]:
    """The request id of each call moved off a stopping replica since ``start``."""
    return [m["request"] for m in MOVED.finditer(_log_since(graph, start))]
