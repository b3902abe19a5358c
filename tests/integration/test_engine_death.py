"""An engine that dies takes its replica out of service at once; the graph heals.

Killing the EngineCore process is what any engine death looks like to the
replica (vLLM marks the engine dead when its core process goes). The replica
must not linger, failing every request routed to it until Serve's health
checks give up on it (3 × 10 s): it exits itself (``Generate._exit_when_engine_dies``),
and Serve starts another. While no Generate replica is live, requests must not
wait in Serve's router for the next one (~40 s): they get 503 + ``Retry-After``.
The times this takes are measured by ``python -m bench.engine_death``
(docs/engine-death.md), not here.
"""

from __future__ import annotations

import signal
import time

import httpx
import psutil

from bench.engine_death import CHAT, engine_core, replica_processes
from bench.harness.servers import Server
from tests.integration.test_failure_semantics import HANG_GUARD_S, running_requests

NO_LIVE_GENERATE = "no Generate replica is running"


# A request down each router that reaches Generate: the Ingress's, and a Derender's.
ROUTED_PROBES = (
    ("/inference/v1/generate", {"token_ids": [1, 2], "sampling_params": {"max_tokens": 1}}, {}),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 1}, {"X-Text-Placement": "tier"}),
)


def wait_all_back(client: httpx.Client, replicas: int) -> None:
    deadline = time.monotonic() + 300
    while len(running_requests(client)) != replicas and time.monotonic() < deadline:
        time.sleep(2)
    assert len(running_requests(client)) == replicas, "Serve did not bring Generate back"
    assert client.get("/health").status_code == 200
    # The control plane counts a new replica once it subscribes, in its __init__; the
    # routers that send it requests hear of it when Serve's controller marks it running
    # (its loop ticks once a second), and until then answer 503 for want of a replica.
    for path, body, headers in ROUTED_PROBES:
        while (answer := client.post(path, json=body, headers=headers)).status_code != 200:
            assert time.monotonic() < deadline, answer.text
            time.sleep(0.5)


def test_an_engine_death_takes_out_its_replica_and_with_none_live_requests_get_503(
    graph: Server, client: httpx.Client
) -> None:
    """One engine dies: its replica exits and the other serves. Then the other's dies
    too, before Serve has replaced the first (~40 s): requests get 503 at once. Serve
    brings both back. (One run of the scenario: each replacement costs an engine start.)"""
    # 1. One engine dies: its replica exits by its own hand, logging why.
    reply = client.post("/v1/chat/completions", json=CHAT, headers={"X-Text-Placement": "inline"})
    assert reply.status_code == 200, reply.text
    first = psutil.Process(int(reply.headers["X-Served-By-Pid"]))
    first_id = reply.headers["X-Served-By"]
    (survivor,) = [p for p in replica_processes("default", "Generate") if p.pid != first.pid]
    engine_core(first.pid).send_signal(signal.SIGKILL)
    _, alive = psutil.wait_procs([first], timeout=HANG_GUARD_S)
    assert not alive, "the replica outlived its engine"
    if graph.process is not None:  # a graph this session started: its log is here
        log = graph.log_path.read_text(errors="replace")
        assert f"engine of replica {first_id} died: exiting" in log

    # Meanwhile the other replica serves (a request Serve had already sent to the
    # dead one is a 503, which the client may retry).
    deadline = time.monotonic() + HANG_GUARD_S
    while client.post("/v1/chat/completions", json=CHAT).status_code != 200:
        assert time.monotonic() < deadline, "the live replica did not serve"
        time.sleep(0.2)

    # 2. The survivor's engine dies too: no Generate replica is live.
    engine_core(survivor.pid).send_signal(signal.SIGKILL)
    _, alive = psutil.wait_procs([survivor], timeout=HANG_GUARD_S)
    assert not alive, "a replica outlived its engine"

    # Until Serve's controller has told the Ingress, a request may still reach a
    # dead replica (503, "a serving tier failed"); after that, the Ingress itself
    # says no replica is running. A new engine takes ~40 s to start, so without
    # the check these requests would wait in Serve's router for it (or time out).
    polls: list[list[httpx.Response]] = []
    deadline = time.monotonic() + HANG_GUARD_S
    while not polls or not all(NO_LIVE_GENERATE in a.text for a in polls[-1]):
        assert time.monotonic() < deadline, [(a.status_code, a.text) for a in polls[-1]]
        polls.append(
            [
                client.post(path, json=body, headers=headers, timeout=HANG_GUARD_S)
                for path, body, headers in (
                    ("/v1/chat/completions", CHAT, {"X-Text-Placement": "inline"}),
                    # Through a live Derender replica, whose own call to Generate has nowhere to go.
                    ("/v1/chat/completions", CHAT, {"X-Text-Placement": "tier"}),
                    ("/inference/v1/generate", {"token_ids": [1, 2], "sampling_params": {}}, {}),
                )
            ]
        )
        time.sleep(0.2)
    for answer in (a for poll in polls for a in poll):
        assert answer.status_code == 503, answer.text
        assert answer.headers["Retry-After"] == "1"
        assert answer.json()["error"]["type"] == "ServiceUnavailableError"
    # Render still answers: only the tiers a request needs decide.
    assert client.post("/tokenize", json={"prompt": "hi"}).status_code == 200

    # 3. Serve replaces both.
    wait_all_back(client, 2)
