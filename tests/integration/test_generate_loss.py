"""A Generate replica lost, by its process dying or by its engine dying, takes only
its own streams with it; with none live, requests get 503 at once; the graph heals.

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
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil

from bench.engine_death import CHAT, engine_core
from bench.harness.servers import Server
from bench.harness.sse_reader import Stream
from tests.integration.test_failure_semantics import (
    HANG_GUARD_S,
    long_body,
    running_requests,
    wait_idle,
)
from tests.integration.test_prefix_routing import Conversation

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


def test_a_lost_generate_replica_cuts_only_its_streams_and_with_none_live_requests_get_503(
    graph: Server, client: httpx.Client
) -> None:
    """Both ways a Generate replica is lost, in one run of the scenario (each loss
    costs an engine start, ~40 s, which the two replacements then share):

    1. A conversation's replica is killed while it streams the conversation's next
       turn: that stream ends with an error event and [DONE], the engine dies with
       its replica, and the conversation's next turn is served by the survivor at
       once (the prefix router must not fail it for its best match being gone).
    2. Before Serve has replaced the first, the survivor's engine dies: its replica
       exits by its own hand, logging why, and with no Generate replica live,
       requests that need one get 503 + Retry-After at once; Render still answers.
    3. Serve brings both back, and no request outlived either loss. Conversations
       started at once on the new replicas keep each to one: the router names
       their blocks before either new engine has reported what it holds."""
    # 1. The conversation's replica is killed mid-stream.
    conversation = Conversation(2000)
    for _ in range(2):
        assert conversation.turn(client).status_code == 200
    holder = conversation.served_by[-1]
    assert conversation.served_by == [holder, holder]
    # A long, paced turn of the same conversation: routed to the holder by its prefix.
    turn_path, turn_body, turn_headers = long_body("inline", client)
    turn_body["messages"] = [*conversation.messages, *turn_body["messages"]]
    stream = Stream(str(client.base_url), turn_path, turn_body, turn_headers)
    stream.start()
    assert stream.wait_first(60) and stream.error is None, stream.error
    assert stream.headers["x-served-by"] == holder, "the long turn left its conversation"
    replica = psutil.Process(conversation.pids[-1])
    engine_processes = replica.children(recursive=True)
    assert engine_processes, "the engine runs in child processes of its replica"
    replica.send_signal(signal.SIGKILL)
    psutil.wait_procs([replica], timeout=HANG_GUARD_S)

    # The next turn comes at once: the router has not yet heard from Serve's
    # controller that its best match is gone, and must not fail it for that.
    started = time.monotonic()
    reply = conversation.turn(client)
    assert reply.status_code == 200, reply.text
    assert conversation.served_by[-1] != holder
    assert time.monotonic() - started < HANG_GUARD_S
    survivor_id = conversation.served_by[-1]
    survivor = psutil.Process(conversation.pids[-1])

    # 2. The survivor's engine dies: its replica exits by its own hand, logging why.
    engine_core(survivor.pid).send_signal(signal.SIGKILL)
    _, alive = psutil.wait_procs([survivor], timeout=HANG_GUARD_S)
    assert not alive, "the replica outlived its engine"
    if graph.process is not None:  # a graph this session started: its log is here
        log = graph.log_path.read_text(errors="replace")
        assert f"engine of replica {survivor_id} died: exiting" in log

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

    # The stream cut in 1: an explicit error, then [DONE]; nothing of its engine
    # is left running (its request went with it).
    stream.join(60)
    assert stream.error is None, stream.error
    assert stream.events[-1] == "[DONE]"
    errors = [e for e in stream.events if isinstance(e, dict) and "error" in e]
    assert errors and errors[0]["error"]["code"] == 503, stream.events[-3:]
    _, alive = psutil.wait_procs(engine_processes, timeout=30)
    assert not alive, alive

    # 3. Serve replaces both; no request outlived the losses.
    wait_all_back(client, 2)
    wait_idle(client, within_s=HANG_GUARD_S)
    conversations = [Conversation(seed) for seed in range(3000, 3004)]
    with ThreadPoolExecutor(len(conversations)) as pool:
        statuses = list(pool.map(lambda c: [c.turn(client).status_code for _ in range(3)],
                                 conversations))  # fmt: skip
    assert all(s == [200, 200, 200] for s in statuses), statuses
    assert all(len(set(c.served_by)) == 1 for c in conversations), [
        c.served_by for c in conversations
    ]
