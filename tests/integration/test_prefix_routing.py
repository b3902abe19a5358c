"""Prefix routing on the real graph: two Generate replicas (``/``), inline text,
so ``X-Served-By`` names the Generate replica that served each turn.

Each conversation has a system prompt of its own, several blocks long, so its
turns share a prefix with nothing but each other.
"""

from __future__ import annotations

import random
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psutil

from bench.harness.servers import Server
from bench.harness.sse_reader import Stream
from tests.integration.conftest import MODEL
from tests.integration.test_engine_death import wait_all_back
from tests.integration.test_failure_semantics import (
    HANG_GUARD_S,
    long_body,
    wait_idle,
)

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "theta",
    "kappa",
    "lambda",
    "sigma",
    "omega",
]
INLINE = {"X-Text-Placement": "inline"}


class Conversation:
    def __init__(self, seed: int):
        self._rng = random.Random(seed)
        system = " ".join(self._rng.choice(WORDS) for _ in range(600))
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": f"{seed} {system}"}]
        self.served_by: list[str] = []
        self.pids: list[int] = []

    def turn(self, client: httpx.Client) -> httpx.Response:
        question = " ".join(self._rng.choice(WORDS) for _ in range(12))
        self.messages.append({"role": "user", "content": question})
        body = {"model": MODEL, "messages": self.messages, "max_tokens": 12, "temperature": 0}
        reply = client.post("/v1/chat/completions", json=body, headers=INLINE)
        if reply.status_code == 200:
            self.served_by.append(reply.headers["X-Served-By"])
            self.pids.append(int(reply.headers["X-Served-By-Pid"]))
            answer = reply.json()["choices"][0]["message"].get("content") or "ok"
            self.messages.append({"role": "assistant", "content": answer})
        return reply


def test_turns_of_a_conversation_stay_on_one_replica_and_conversations_spread(
    graph: Server, client: httpx.Client
) -> None:
    conversations = [Conversation(seed) for seed in range(1000, 1008)]

    def talk(conversation: Conversation) -> list[int]:
        return [conversation.turn(client).status_code for _ in range(3)]

    with ThreadPoolExecutor(len(conversations)) as pool:
        statuses = list(pool.map(talk, conversations))
    assert all(s == [200, 200, 200] for s in statuses), statuses
    for conversation in conversations:
        assert len(set(conversation.served_by)) == 1, conversation.served_by
    used = {c.served_by[0] for c in conversations}
    assert len(used) == 2, f"eight conversations at once all went to {used}"


def test_a_replica_killed_mid_stream_ends_its_stream_and_its_conversation_goes_on(
    graph: Server, client: httpx.Client
) -> None:
    """A conversation's replica is killed while it streams the conversation's next
    turn: that stream ends with an error event and [DONE], the engine dies with its
    replica, the conversation's next turn is served by the survivor at once, and
    Serve brings the replica back. (One kill for both: each costs an engine start.)"""
    conversation = Conversation(2000)
    for _ in range(2):
        assert conversation.turn(client).status_code == 200
    holder = conversation.served_by[-1]
    assert conversation.served_by == [holder, holder]
    # A long, paced turn of the same conversation: routed to the holder by its prefix.
    path, body, headers = long_body("inline", client)
    body["messages"] = [*conversation.messages, *body["messages"]]
    stream = Stream(str(client.base_url), path, body, headers)
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

    # The cut stream: an explicit error, then [DONE].
    stream.join(60)
    assert stream.error is None, stream.error
    assert stream.events[-1] == "[DONE]"
    errors = [e for e in stream.events if isinstance(e, dict) and "error" in e]
    assert errors and errors[0]["error"]["code"] == 503, stream.events[-3:]
    # Nothing of that engine is left running (its request went with it).
    _, alive = psutil.wait_procs(engine_processes, timeout=30)
    assert not alive, alive
    wait_all_back(client, 2)
    wait_idle(client, within_s=HANG_GUARD_S)  # no request outlived the kill
