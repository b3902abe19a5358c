"""An engine that dies takes its replica out of service at once; the graph heals.

Killing the EngineCore process is what any engine death looks like to the
replica (vLLM marks the engine dead when its core process goes). The replica
must not linger, failing every request routed to it until Serve's health
checks give up on it (3 × 10 s): it exits itself (``Generate._exit_when_engine_dies``),
and Serve starts another. The time this takes is measured by
``python -m bench.engine_death`` (docs/engine-death.md), not here.
"""

from __future__ import annotations

import signal
import time

import httpx
import psutil

from bench.engine_death import CHAT, engine_core
from tests.integration.test_failure_semantics import HANG_GUARD_S, running_requests
from tests.support.servers import Server


def test_a_replica_whose_engine_died_exits_and_is_replaced(
    graph: Server, client: httpx.Client
) -> None:
    reply = client.post("/v1/chat/completions", json=CHAT, headers={"X-Text-Placement": "inline"})
    assert reply.status_code == 200, reply.text
    replica = psutil.Process(int(reply.headers["X-Served-By-Pid"]))
    replica_id = reply.headers["X-Served-By"]
    engine_core(replica.pid).send_signal(signal.SIGKILL)

    # Gone by its own hand: the replica logs why before it exits.
    _, alive = psutil.wait_procs([replica], timeout=HANG_GUARD_S)
    assert not alive, "the replica outlived its engine"
    if graph.process is not None:  # a graph this session started: its log is here
        log = graph.log_path.read_text(errors="replace")
        assert f"engine of replica {replica_id} died: exiting" in log

    # Serve replaces it; meanwhile the other replica serves (a request Serve had
    # already sent to the dead one is a 503, which the client may retry).
    deadline = time.monotonic() + HANG_GUARD_S
    while client.post("/v1/chat/completions", json=CHAT).status_code != 200:
        assert time.monotonic() < deadline, "the live replica did not serve"
        time.sleep(0.2)
    deadline = time.monotonic() + 300
    while len(running_requests(client)) != 2 and time.monotonic() < deadline:
        time.sleep(2)
    assert len(running_requests(client)) == 2, "Serve did not bring the Generate replica back"
    assert client.get("/health").status_code == 200
