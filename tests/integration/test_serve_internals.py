"""Each of Serve's private reads (``deployments/transport/serve_internals.py``) inside a
real Serve replica, with the graph's Serve switches: a Ray upgrade that moves one
fails here, naming it."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from bench.harness.servers import PRISTINE_ENV, REPO, VENV_BIN, graph_env
from deployments.config.serve_env import SERVE_ENV


@pytest.fixture(scope="module")
def seen() -> dict[str, Any]:
    env = {**PRISTINE_ENV, "PATH": f"{VENV_BIN}:{PRISTINE_ENV.get('PATH', '')}", **graph_env()}
    probe = subprocess.run(
        [sys.executable, "-m", "tests.support.serve_door_probe"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    lines = [line for line in probe.stdout.splitlines() if line.startswith("{")]
    assert probe.returncode == 0 and lines, probe.stderr[-3000:]
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def test_router_view_reads_the_routers_replicas_and_autoscaling(seen: dict[str, Any]) -> None:
    # DeploymentHandle._router._asyncio_router: running_replicas_populated(),
    # _request_router.curr_replicas, _metrics_manager._deployment_config.
    assert seen["view"] == {"running": 2, "zero": False}, "router_view: Target's 2 replicas"
    assert seen["zero_view"] == {"running": 1, "zero": True}, "router_view: min_replicas 0"


def test_assignment_future_is_the_calls_replica_assignment(seen: dict[str, Any]) -> None:
    # DeploymentResponse._replica_result_future: a Task on the caller's loop under
    # the graph's switches (a concurrent Future on Serve's own router thread).
    assert seen["assignment_future"] in ("Task", "Future"), "assignment_future"
    assert seen["answer"] == "ok"


def test_ping_actor_is_answered_by_a_live_replica(seen: dict[str, Any]) -> None:
    assert seen["pinged"], "ping_actor: ActorHandle.__ray_ready__"


def test_replica_log_buffers_are_serves_buffered_file_handlers(seen: dict[str, Any]) -> None:
    assert seen["logger"] == "ray.serve", "serve_logger_name: constants.SERVE_LOGGER_NAME"
    assert seen["log_buffers"] >= 1, "replica_log_buffers: Serve's MemoryHandler"
    assert seen["log_buffer_targets"] and all(
        t.endswith("FileHandler") for t in seen["log_buffer_targets"]
    ), seen["log_buffer_targets"]


def test_drop_access_log_lines_silences_the_replicas_access_lines(seen: dict[str, Any]) -> None:
    # logging_utils.log_access_log_filter, and the serve_access_log mark it reads on the
    # access records Serve makes: each of three calls before wrote its line, none after.
    assert seen["access_lines"]["before"] >= 2, "Serve's access records: serve_access_log"
    assert seen["access_lines"]["after"] == 0, "drop_access_log_lines"


def test_grpc_cap_and_proxy_ids_inside_a_replica(seen: dict[str, Any]) -> None:
    assert seen["grpc_cap"] == int(SERVE_ENV["RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH"])
    assert len(seen["proxy_request_id"]) == 36, "proxy_request_id: utils.generate_request_id"


def test_draining_probe_turns_when_serve_stops_the_replica(seen: dict[str, Any]) -> None:
    # ReplicaActor._replica_impl._shutting_down, read inside a replica whose
    # application is deleted while it serves a call.
    assert seen["draining"] == [False, True], "draining_probe"


def test_serve_request_id_is_the_callers_in_its_callee(seen: dict[str, Any]) -> None:
    assert seen["request_id"], "serve_request_id: context._serve_request_context"
    assert seen["callee_request_id"] == seen["request_id"], "serve_request_id: propagation"


def test_a_handle_made_by_reference_goes_on_the_replicas_data_plane(seen: dict[str, Any]) -> None:
    # handle.options(_by_reference=...) and constants.RAY_SERVE_USE_GRPC_BY_DEFAULT: under
    # the graph's switches a replica calls over Serve's gRPC, whatever the handle's maker.
    assert seen["by_reference"] == {"made": True, "own": False}, "on_this_process_data_plane"
    assert seen["answers_on_own_plane"] == ["ok", "ok"]


def test_pick_replica_names_one_of_the_live_replicas(seen: dict[str, Any]) -> None:
    # DeploymentHandle.choose_replica with the router's pick-only `_reserve=False`, and
    # ReplicaContext._deployment_config.max_ongoing_requests in the replicas picked.
    picks = seen["picks"]
    assert not picks["none"], "pick_replica: choose_replica(_reserve=False) failed"
    assert set(picks["picked"]) <= set(picks["ids"]) and picks["picked"], picks
    assert picks["max_ongoing"] == [7], "replica_max_ongoing_requests: _deployment_config"


def test_a_requests_serve_context_is_read_and_entered_in_a_task_of_its_own(
    seen: dict[str, Any],
) -> None:
    # context._serve_request_context (read) and context._set_request_context (entered):
    # what a request channel carries to the callee, and the id it then runs under.
    _route, request_id, app = seen["request_fields"]
    assert request_id == seen["request_id"] and app == "door", seen["request_fields"]
    assert seen["entered_request_id"] == "entered-id", "enter_serve_request"
