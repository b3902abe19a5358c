"""Prefix routing on the real graph: two Generate replicas (``/``), inline text,
so ``X-Served-By`` names the Generate replica that served each turn.

Each conversation has a system prompt of its own, several blocks long, so its
turns share a prefix with nothing but each other.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from bench.harness.servers import Server
from tests.integration.conftest import MODEL

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
    def __init__(self, seed: int, words: int = 600):
        self._rng = random.Random(seed)
        system = " ".join(self._rng.choice(WORDS) for _ in range(words))
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


def test_new_conversations_one_at_a_time_spread_over_idle_replicas(client: httpx.Client) -> None:
    """Issue 65's case: eight conversations, each over a 500-word system prompt of its
    own, four turns each, turns interleaved, one request at a time. With Serve's power
    of two, the replica whose queue Serve had just read took the first turns (in one
    run of two all 32 requests went to one replica); a prompt no replica holds now
    goes where there is room, the replica that was sent nothing for longest first
    among equals."""
    conversations = [Conversation(seed, words=500) for seed in range(2000, 2008)]
    for _ in range(4):
        for conversation in conversations:
            reply = conversation.turn(client)
            assert reply.status_code == 200, reply.text
    for conversation in conversations:
        assert len(set(conversation.served_by)) == 1, conversation.served_by
    homes = [c.served_by[0] for c in conversations]
    assert len(set(homes)) == 2 and min(homes.count(h) for h in set(homes)) >= 2, homes
    # Unrelated single requests, one at a time, spread as well.
    singles = [Conversation(seed, words=500) for seed in range(2100, 2106)]
    served = []
    for single in singles:
        assert single.turn(client).status_code == 200
        served.append(single.served_by[0])
    assert len(set(served)) == 2 and min(served.count(s) for s in set(served)) >= 2, served
