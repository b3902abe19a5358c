"""A Generate replica lost, by its process dying or by its engine dying, moves its
streams to a live replica, inline text included; with none live, requests get 503
at once; the graph heals.

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

import contextlib
import re
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psutil

from bench.engine_death import CHAT, engine_core
from bench.harness.servers import Server
from bench.harness.sse_reader import Stream
from bench.observe import REPLICA_TITLE
from tests.integration.conftest import MODEL
from tests.integration.test_failure_semantics import (
    HANG_GUARD_S,
    long_body,
    running_requests,
    wait_idle,
)
from tests.integration.test_prefix_routing import Conversation
from tests.integration.test_skeleton import rendered

NO_LIVE_GENERATE = "no Generate replica is running"
# Streams that move (transport/migration.py): greedy and paced, so the engine dies
# under them mid-way on any host, after each delivered KILL_AFTER tokens.
MOVING_TOKENS = 1000
MOVING_PACE_MS = 10
KILL_AFTER = 100
# A stream that waits for a new replica when none is live (graph config's
# generate.migration_wait_s), then goes on at long_body's pace.
WAITING_TOKENS = 500
# Unary requests of the same kinds, killed under too.
UNARY_KINDS = ("tokens", "tier chat", "inline chat")
STATS_PERIOD_S = 1.0  # generate.prefix_routing.stats_period_s, the default
# What a Derender replica logs when it moves a stream (deployments/transport/migration.py).
MOVED_LINE = re.compile(
    r"request (?P<request>\S+): its Generate replica was lost .* after (?P<after>\d+) tokens"
)


# A request down each router that reaches Generate: the Ingress's, and a Derender's.
ROUTED_PROBES: tuple[tuple[str, dict[str, Any], dict[str, str]], ...] = (
    ("/inference/v1/generate", {"token_ids": [1, 2], "sampling_params": {"max_tokens": 1}}, {}),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 1}, {"X-Text-Placement": "tier"}),
)


def generate_replicas(app: str = "default") -> list[psutil.Process]:
    """The processes of ``app``'s Generate replicas on this host, started or starting."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            match = REPLICA_TITLE.search(" ".join(process.cmdline()))
            if match and (match["app"], match["deployment"]) == (app, "Generate"):
                found.append(process)
    return found


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


def test_a_lost_generate_replica_moves_tier_streams_and_with_none_live_requests_get_503(
    graph: Server, client: httpx.Client
) -> None:
    """Both ways a Generate replica is lost, in one run of the scenario (each loss
    costs an engine start, ~40 s, which the two replacements then share):

    1. A conversation's engine dies while its replica streams the conversation's
       next turn inline (sampled) and five greedy streams (inline and tier chat,
       and ``output_mode`` ``derender``, ``tokens`` and ``text``): the replica
       exits by its own hand, logging why; every stream goes on on the survivor
       from the tokens it delivered, as if nothing happened
       (``transport/migration.py``, ``text/inline_move.py``); the conversation's
       next turn is served by the survivor at once.
    2. The survivor is killed (and the first one's replacement, if Serve has started
       it by then): its engine dies
       with it, a tier stream on it has nowhere to go and waits for Serve's next
       replica (``generate.migration_wait_s``), where it goes on; with no Generate
       replica live, new requests that need one get 503 + Retry-After at once;
       Render still answers.
    3. Serve brings both back, and no request outlived either loss. Conversations
       started at once on the new replicas keep each to one: the router names
       their blocks before either new engine has reported what it holds. Each moved
       stream's tokens after its move are what a fresh greedy request for the
       prompt and the tokens before it gives."""
    log_start = _log_size(graph)
    # 1. The conversation's engine dies under three streams.
    # A shorter system prompt than most conversations: the moving streams' 1,000
    # tokens must fit the graph's context (4,096) after it and two turns.
    conversation = Conversation(2000, words=200)
    for _ in range(2):
        assert conversation.turn(client).status_code == 200
    holder = conversation.served_by[-1]
    assert conversation.served_by == [holder, holder]
    # The holder's engine reports its blocks each stats period (1 s), and Serve's
    # controller passes them on each control loop (1 s): then every Derender replica's
    # router knows them too (checked below, from where the streams run).
    time.sleep(3 * STATS_PERIOD_S)
    # A long, paced turn of the same conversation: routed to the holder by its prefix.
    turn_path, turn_body, turn_headers = long_body("inline", client, tokens=MOVING_TOKENS)
    turn_body["messages"] = [*conversation.messages, *turn_body["messages"]]
    stream = Stream(str(client.base_url), turn_path, turn_body, turn_headers)
    stream.start()
    assert stream.wait_first(60) and stream.error is None, stream.error
    assert stream.headers["x-served-by"] == holder, "the long turn left its conversation"
    prompt, bodies = moving_bodies(client, conversation.messages)
    moving = {kind: Stream(str(client.base_url), *body) for kind, body in bodies.items()}
    for moving_stream in moving.values():
        moving_stream.start()
    # And unary requests, which are made again from the start. (More would tip the
    # prefix router into spreading them by load.)
    pool = ThreadPoolExecutor(len(UNARY_KINDS))
    unary = {kind: pool.submit(unary_tokens, client, *bodies[kind]) for kind in UNARY_KINDS}
    deadline = time.monotonic() + HANG_GUARD_S
    while not all(len(token_ids(m)) >= KILL_AFTER or m.ended_at for m in moving.values()):
        assert time.monotonic() < deadline, {k: len(token_ids(m)) for k, m in moving.items()}
        time.sleep(0.05)
    # The Ingress's router and the tier's (one per Derender replica) sent them where
    # their prefix is; one of them may be routed by load instead (one was, in four of six
    # runs on 2026-12-05, at b4992a8 too). That the moving streams ran on the holder is
    # checked below, where each must have moved exactly once, after KILL_AFTER tokens;
    # every unary answer is checked whole wherever it ran.
    running = running_requests(client)
    assert running.get(holder, 0) >= len(moving) + len(unary), (holder, running)
    assert sum(running.values()) == 1 + len(moving) + len(unary), (holder, running)
    replica = psutil.Process(conversation.pids[-1])
    engine_core(replica.pid).send_signal(signal.SIGKILL)
    _, alive = psutil.wait_procs([replica], timeout=HANG_GUARD_S)
    assert not alive, "the replica outlived its engine"
    if graph.process is not None:  # a graph this session started: its log is here
        log = graph.log_path.read_text(errors="replace")
        assert f"engine of replica {holder} died: exiting" in log

    # The next turn comes at once: the router may not yet have heard from Serve's
    # controller that its best match is gone, and must not fail it for that.
    started = time.monotonic()
    reply = conversation.turn(client)
    assert reply.status_code == 200, reply.text
    assert conversation.served_by[-1] != holder
    assert time.monotonic() - started < HANG_GUARD_S
    survivor = psutil.Process(conversation.pids[-1])

    # The sampled inline turn went on too (its tokens are checked by count only).
    stream.join(120)
    assert stream.error is None, stream.error
    assert [e for e in stream.events if isinstance(e, dict) and "error" in e] == []
    assert stream.events.count("[DONE]") == 1 and stream.events[-1] == "[DONE]"
    assert stream.finish_reasons() == ["length"], stream.events[-3:]
    usage = [e["usage"] for e in stream.events if isinstance(e, dict) and e.get("usage")][-1]
    assert usage["completion_tokens"] == MOVING_TOKENS, usage
    # The moved streams: whole, as an uninterrupted run ends.
    for kind, moved in moving.items():
        moved.join(120)
        assert_whole(kind, moved, len(prompt), MOVING_TOKENS)
    for kind, answer in unary.items():
        assert answer.result(120) == MOVING_TOKENS, kind
    pool.shutdown()

    # 2. The survivor is killed under a tier stream: with no replica live, it waits.
    cut_path, cut_body, cut_headers = long_body("tier", client, tokens=WAITING_TOKENS)
    cut = Stream(str(client.base_url), cut_path, cut_body, cut_headers)
    cut.start()
    assert cut.wait_first(60) and cut.error is None, cut.error
    engine_processes = survivor.children(recursive=True)
    assert engine_processes, "the engine runs in child processes of its replica"
    # Serve may have started the first one's replacement meanwhile (its engine start
    # races the streams above; one CI run saw it live here, answering 200): it goes
    # too, so that no Generate replica is live.
    replacements = [p for p in generate_replicas() if p.pid != survivor.pid]
    for replica in replacements:
        engine_processes += replica.children(recursive=True)
    for replica in [survivor, *replacements]:
        replica.send_signal(signal.SIGKILL)
    psutil.wait_procs([survivor, *replacements], timeout=HANG_GUARD_S)

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

    # Nothing of the killed engine is left running (it went with its replica).
    _, alive = psutil.wait_procs(engine_processes, timeout=30)
    assert not alive, alive
    # The tier stream had nowhere to move: it waited for Serve's next replica (an
    # engine start) and went on there, whole.
    cut.join(HANG_GUARD_S + 300)
    assert cut.error is None, cut.error
    assert [e for e in cut.events if isinstance(e, dict) and "error" in e] == [], cut.events[-3:]
    assert cut.events.count("[DONE]") == 1 and cut.events[-1] == "[DONE]"
    assert cut.finish_reasons() == ["length"], cut.events[-3:]
    usage = [e["usage"] for e in cut.events if isinstance(e, dict) and e.get("usage")][-1]
    assert usage["completion_tokens"] == WAITING_TOKENS, usage

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
    # Each moved stream's tokens after the move are a fresh greedy request's for the
    # prompt and the tokens before (where the move happened is in the graph's log).
    if graph.process is not None:
        moves = _moves(graph, log_start)
        for kind, moved in moving.items():
            tokens = token_ids(moved)
            at = [after for request_id, after in moves if request_id in moved.stream_id]
            assert len(at) == 1 and KILL_AFTER <= at[0] < MOVING_TOKENS, (kind, moves)
            fresh = client.post(
                "/inference/v1/generate",
                json={
                    "token_ids": prompt + tokens[: at[0]],
                    "sampling_params": {
                        "max_tokens": MOVING_TOKENS - at[0],
                        "temperature": 0,
                        "ignore_eos": True,
                    },
                },
            )
            assert fresh.status_code == 200, fresh.text
            assert fresh.json()["choices"][0]["token_ids"] == tokens[at[0] :], kind


def moving_bodies(
    client: httpx.Client,
    messages: list[dict[str, Any]],
    tokens: int = MOVING_TOKENS,
    pace_ms: float = MOVING_PACE_MS,
) -> tuple[list[int], dict[str, tuple[str, dict[str, Any], dict[str, str]]]]:
    """The prompt's token ids, and greedy paced streams of the conversation's next
    turn, as inline and tier chat and as each ``output_mode`` of generate, each
    returning its token ids."""
    chat: dict[str, Any] = {
        "model": MODEL,
        "messages": [*messages, {"role": "user", "content": "Count on, one word at a time."}],
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "vllm_xargs": {"pace_ms": pace_ms},
    }
    request = rendered(client, {k: v for k, v in chat.items() if k != "stream_options"})
    request.update(stream=True, stream_options={"include_usage": True})
    # Each its own id: a move is found in the log by it.
    modes = {
        mode: {**request, "output_mode": mode, "request_id": f"moving-{mode}-{uuid.uuid4().hex}"}
        for mode in ("derender", "tokens", "text")
    }
    for mode in ("tokens", "text"):
        modes[mode].pop("parse_context")
    return list(request["token_ids"]), {
        "inline chat": ("/v1/chat/completions", chat, {"X-Text-Placement": "inline"}),
        "tier chat": ("/v1/chat/completions", chat, {"X-Text-Placement": "tier"}),
        **{mode: ("/inference/v1/generate", body, {}) for mode, body in modes.items()},
    }


def assert_whole(kind: str, stream: Stream, prompt_tokens: int, tokens: int) -> None:
    """A stream that ended as an uninterrupted greedy run of ``tokens`` ends: no
    error event, one ``[DONE]`` last, every token once, ``usage`` of the whole."""
    assert stream.error is None, (kind, stream.error)
    assert [e for e in stream.events if isinstance(e, dict) and "error" in e] == [], kind
    assert stream.events.count("[DONE]") == 1 and stream.events[-1] == "[DONE]", kind
    assert stream.finish_reasons() == ["length"], (kind, stream.events[-3:])
    assert len(token_ids(stream)) == tokens, kind
    usage = [e["usage"] for e in stream.events if isinstance(e, dict) and e.get("usage")][-1]
    assert usage["prompt_tokens"] == prompt_tokens, (kind, usage)
    assert usage["completion_tokens"] == tokens, (kind, usage)
    assert usage["total_tokens"] == prompt_tokens + tokens, (kind, usage)


def unary_tokens(
    client: httpx.Client, path: str, body: dict[str, Any], headers: dict[str, str]
) -> int:
    """The request, unary and with an id of its own: how many tokens it answered."""
    body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    if "request_id" in body:
        body["request_id"] = f"unary-{uuid.uuid4().hex}"
    answer = client.post(path, json=body, headers=headers, timeout=HANG_GUARD_S + 90)
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    assert choice["finish_reason"] == "length", choice
    return len(choice["token_ids"])


def token_ids(stream: Stream) -> list[int]:
    """The token ids a stream delivered so far (choice 0)."""
    return [
        token
        for event in stream.events
        if isinstance(event, dict)
        for choice in event.get("choices", [])
        if choice.get("index", 0) == 0
        for token in choice.get("token_ids") or []
    ]


def _log_size(graph: Server) -> int:
    return graph.log_path.stat().st_size if graph.process is not None else 0


def _moves(graph: Server, since: int) -> list[tuple[str, int]]:
    """(request id, tokens delivered before) of each stream moved since ``since``."""
    with graph.log_path.open("rb") as log:
        log.seek(since)
        text = log.read().decode(errors="replace")
    return [(m["request"], int(m["after"])) for m in MOVED_LINE.finditer(text)]
