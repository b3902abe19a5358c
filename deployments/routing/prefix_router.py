"""Generate's request router: each call goes to the replica whose engine holds
the longest prefix of its tokens, unless that replica is much busier.

The Render tier has already made the exact token ids before a Generate
replica is chosen, so the router names the request's blocks as vLLM does
(``kv_blocks.BlockKeying``) and looks them up in what each engine holds:

- **the engine's own truth**: every Generate replica keeps the block keys its
  engine's KV cache events report (``kv_index.EngineBlocks``) and hands them
  to Serve as routing stats, which Serve's controller pushes to every
  router (every Ingress and Derender replica) each ``stats_period_s``;
- **what this router just sent**: the blocks of a request it routed count as
  held by that replica for a few stats periods, until the engine's own
  report covers them. A conversation's next turn often comes before the next
  report does.

Rule, per call: ``match`` = leading blocks of the prompt each candidate
holds. If the best match beats the worst by at least ``min_match_ratio`` of the
prompt's blocks, the best-matching replicas come first, unless their queue is
longer than the shortest by more than ``imbalance`` requests; Serve picks the
shortest queue among them, and falls through to the next rank if none has room.

Otherwise no replica holds the prompt (a first turn, a prompt sharing only a
template's first block, one the router cannot key): it goes where there is
room (``room_order``), one replica a rank: the shortest queue, then the
emptiest KV cache (as its engine last reported it, in steps of
``KV_USE_STEP``), then the replica this router sent a call to least recently,
ties at random. Not Serve's power of two: among the replicas it probes, Serve
takes one whose queue length it holds from a recent call over one it would have
to probe, so at low load, with every queue equal, the replica that served last
serves next, and new conversations piled onto one replica (issue 65: all 32
turns of 8 conversations in one run of two).

Pinned calls (step channels) go where they name, and replicas a call asks to
avoid are left out, as in ``PinnedRouter``. A
replica that leaves the router's list is forgotten with everything it held;
a new one starts with nothing.
"""

from __future__ import annotations

import random
import time
from array import array
from collections import OrderedDict
from typing import Any, TypeGuard, TypeVar

from ray.serve.config import RequestRouterConfig
from ray.serve.request_router import PendingRequest, ReplicaID, RunningReplica

from deployments.messages.replies import RenderedText
from deployments.observability.metrics import graph_metrics
from deployments.routing.block_keys import BlockKeying
from deployments.routing.engine_blocks import (
    CHANNEL_REQUESTS_KEY,
    CHANNELS_KEY,
    KV_USE_KEY,
    ROUTING_STATS_KEY,
)
from deployments.routing.pinned_router import PinnedRouter, picked_loads, without_avoided

R = TypeVar("R")
# Requests whose keys were computed but that were never routed (cancelled) are dropped.
_PENDING_KEYS_MAX = 4096
# Blocks this router routed, per replica, that it remembers until the engine reports.
_SENT_BLOCKS_MAX = 65536
# KV cache use closer than this (a fraction of the cache) is a tie: at low load, what
# an engine's last step left counted says nothing of where there is room.
KV_USE_STEP = 0.05


class _Held:
    """One replica's blocks as its engine last reported them."""

    def __init__(self, stats: dict[str, Any]):
        self.version = stats.get("version")
        self.keying = BlockKeying(
            block_size=int(stats["block_size"]),
            hash_algo=str(stats["hash_algo"]),
            seed=str(stats["seed"]),
        )
        blocks = array("Q")
        blocks.frombytes(stats["blocks"])
        self.blocks = frozenset(blocks)


class PrefixRouter(PinnedRouter):
    def initialize_state(
        self,
        imbalance: int = 8,
        min_match_ratio: float = 0.1,
        sent_ttl_s: float = 5.0,
        **kwargs: Any,
    ) -> None:
        super().initialize_state(**kwargs)
        self._imbalance = imbalance
        self._min_match_ratio = min_match_ratio
        self._sent_ttl_s = sent_ttl_s
        self._held: dict[ReplicaID, _Held] = {}
        self._last_keying: BlockKeying | None = None
        self._sent: dict[ReplicaID, OrderedDict[int, float]] = {}
        self._pending_keys: OrderedDict[str, list[int]] = OrderedDict()
        self._kv_use: dict[ReplicaID, float] = {}
        self._channels: dict[ReplicaID, int] = {}
        self._channel_requests: dict[ReplicaID, int] = {}
        # While a pick is ranked: the picking caller's requests in flight, by replica
        # (none listed: none there); None while a call is.
        self._caller_loads: dict[str, int] | None = None
        self._last_sent: dict[ReplicaID, float] = {}
        self._rng = random.Random()

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if pending_request is None or pending_request.kwargs.get("replica") is not None:
            return await super().choose_replicas(candidate_replicas, pending_request)
        candidate_replicas = without_avoided(candidate_replicas, pending_request)
        picking = picked_loads(pending_request)
        # A pick (a request channel's) goes unseen by Serve's router, whose queue
        # lengths then never move: the caller's own requests in flight count too.
        self._caller_loads = picking
        try:
            ranked = self._by_prefix(candidate_replicas, pending_request)
            if len(candidate_replicas) < 2:
                ranks = [candidate_replicas]
            else:
                # Where the best match has no room, the call goes where there is most.
                by_room = [[replica] for replica in self._by_room(candidate_replicas)]
                ranks = [ranked, *by_room] if ranked else by_room
        finally:
            self._caller_loads = None
        if picking is not None:
            # Serve takes the first replica of the first rank and sends nothing, so
            # no ``on_request_routed`` follows; the request goes there on a channel.
            first = next((rank[0] for rank in ranks if rank), None)
            if first is not None:
                self.on_request_routed(pending_request, first.replica_id, None)
        return ranks

    def _by_prefix(
        self, candidates: list[RunningReplica], pending: PendingRequest
    ) -> list[RunningReplica]:
        """The replicas to try first for this request, or none (route by load)."""
        routing = graph_metrics().prefix_routing
        prompt = _prompt(pending)
        if prompt is None:
            routing.inc(tags={"outcome": "no_prompt"})
            return []
        keying = self._keying(candidates)
        if keying is None:
            routing.inc(tags={"outcome": "unkeyed"})
            return []
        token_ids, cache_salt = prompt
        keys = keying.keys(token_ids, cache_salt)
        if not keys:
            routing.inc(tags={"outcome": "no_prompt"})
            return []
        # Remembered even with one candidate: a replica this router has not heard
        # of yet (one just started) is no reason to forget where a conversation went.
        request_id = pending.metadata.internal_request_id
        self._pending_keys[request_id] = keys
        while len(self._pending_keys) > _PENDING_KEYS_MAX:
            self._pending_keys.popitem(last=False)
        if len(candidates) < 2:
            routing.inc(tags={"outcome": "single_candidate"})
            return []
        now = time.monotonic()
        match = {r: self._leading_held(r.replica_id, keys, now) for r in candidates}
        loads = {r: self._queue_len(r) for r in candidates}
        chosen = prefix_choice(len(keys), match, loads, self._imbalance, self._min_match_ratio)
        graph_metrics().prefix_matched_blocks.observe(max(match.values()))
        routing.inc(tags={"outcome": "prefix" if chosen else "no_match"})
        return chosen

    def _by_room(self, candidates: list[RunningReplica]) -> list[RunningReplica]:
        """Every candidate, where there is most room first (``room_order``)."""
        return room_order(
            candidates,
            {r: self._queue_len(r) or 0 for r in candidates},
            {r: self._kv_use.get(r.replica_id, 0.0) for r in candidates},
            {r: self._last_sent.get(r.replica_id, 0.0) for r in candidates},
            self._rng,
        )

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any
    ) -> None:
        if pending_request.kwargs.get("replica") is None:  # a request, not a channel's call
            self._last_sent[replica_id] = time.monotonic()
        keys = self._pending_keys.pop(pending_request.metadata.internal_request_id, None)
        if not keys:
            return
        sent = self._sent.setdefault(replica_id, OrderedDict())
        expiry = time.monotonic() + self._sent_ttl_s
        for key in keys:
            sent[key] = expiry
            sent.move_to_end(key)
        while len(sent) > _SENT_BLOCKS_MAX:
            sent.popitem(last=False)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        live = {r.replica_id for r in replicas}
        for gone in [r for r in self._held if r not in live]:
            del self._held[gone]
        tables = (self._sent, self._kv_use, self._channels, self._channel_requests, self._last_sent)
        for table in tables:
            for gone in [r for r in table if r not in live]:
                del table[gone]
        for r in replicas:
            reported = r.routing_stats or {}
            kv_use, channels = reported.get(KV_USE_KEY), reported.get(CHANNELS_KEY)
            if isinstance(kv_use, float):
                self._kv_use[r.replica_id] = kv_use
            else:
                self._kv_use.pop(r.replica_id, None)
            if isinstance(channels, int):
                self._channels[r.replica_id] = channels
            else:
                self._channels.pop(r.replica_id, None)
            on_channels = reported.get(CHANNEL_REQUESTS_KEY)
            if isinstance(on_channels, int):
                self._channel_requests[r.replica_id] = on_channels
            else:
                self._channel_requests.pop(r.replica_id, None)
            stats = reported.get(ROUTING_STATS_KEY)
            if stats is None:
                continue
            held = self._held.get(r.replica_id)
            if held is None or held.version != stats.get("version"):
                try:
                    self._held[r.replica_id] = held = _Held(stats)
                    self._last_keying = held.keying
                except (KeyError, TypeError, ValueError):
                    # A report this router cannot read (another version of the graph
                    # mid-upgrade): that replica counts as holding nothing.
                    self._held.pop(r.replica_id, None)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        tables = (self._held, self._sent, self._kv_use, self._channels, self._channel_requests)
        for table in (*tables, self._last_sent):
            table.pop(replica_id, None)

    def _keying(self, candidates: list[RunningReplica]) -> BlockKeying | None:
        reported = {
            self._held[r.replica_id].keying for r in candidates if r.replica_id in self._held
        }
        return common_keying(reported, self._last_keying)

    def _leading_held(self, replica_id: ReplicaID, keys: list[int], now: float) -> int:
        held = self._held.get(replica_id)
        blocks = held.blocks if held is not None else frozenset()
        sent = self._sent.get(replica_id)
        count = 0
        for key in keys:
            if key in blocks:
                count += 1
                continue
            expiry = sent.get(key) if sent is not None else None
            if expiry is None or expiry < now:
                break
            count += 1
        return count

    def _queue_len(self, replica: RunningReplica) -> int | None:
        """Requests on the replica as the router last heard, less the step channels it
        reports (Serve counts each caller's channel as a request that never ends, so a
        replica more callers hold channels to would look busier for good); None if the
        router has not heard within Serve's cache timeout (sent nothing, probed nothing).
        Plus the requests it runs that came on request channels, which Serve does not
        count, as it last reported them. In a pick (a request channel's, which Serve's
        router never hears of), at least the picking caller's own requests in flight
        there: the freshest word of its load."""
        known: int | None = self.replica_queue_len_cache.get(replica.replica_id)
        on_channels = self._channel_requests.get(replica.replica_id)
        picking = self._caller_loads
        mine = None if picking is None else picking.get(replica.replica_id.unique_id, 0)
        if known is None and on_channels is None:
            return mine
        calls = 0 if known is None else max(0, known - self._channels.get(replica.replica_id, 0))
        reported = calls + (on_channels or 0)
        return reported if mine is None else max(reported, mine)


def common_keying(reported: set[BlockKeying], last: BlockKeying | None) -> BlockKeying | None:
    """The keying to name a request's blocks by: the one the candidates reported;
    None if they differ (an upgrade mid-way). While none of them has reported yet
    (every replica just replaced), the last keying any replica reported: it is the
    graph's, so the router keeps remembering what it sends a new replica, and a
    conversation's next turn follows its first there before the first engine
    report reaches this router. None if no replica has ever reported."""
    if not reported:
        return last
    return next(iter(reported)) if len(reported) == 1 else None


def prefix_choice(
    blocks: int,
    match: dict[R, int],
    loads: dict[R, int | None],
    imbalance: int,
    min_match_ratio: float,
) -> list[R]:
    """The replicas to try first for a prompt of ``blocks`` full blocks, given the
    leading blocks each holds (``match``) and its queue (``loads``); none: route by load.

    The best match must beat the worst by at least ``min_match_ratio`` of the
    prompt, or prefixes say nothing about where it should go (a first turn; a
    prompt that shares only a template's first block with everything else,
    where following the match would send every request to one replica).
    A queue the router has not heard of lately (None) is no evidence of imbalance:
    the shortest is the shortest it knows. Counted as empty, a replica the router sent
    nothing to for Serve's cache timeout (10 s) would look idle beside the busy
    holder of a prefix, and Serve, trying this router's ranks one replica at a time,
    probes only the replica it tries, so such entries stay stale.
    """
    best = max(match.values())
    if best == 0 or best - min(match.values()) < min_match_ratio * blocks:
        return []
    known = [load for load in loads.values() if load is not None]
    least = min(known) if known else 0
    return [
        r
        for r, held in match.items()
        if held == best and ((load := loads[r]) is None or load - least <= imbalance)
    ]


def room_order(
    candidates: list[R],
    loads: dict[R, int],
    kv_use: dict[R, float],
    last_sent: dict[R, float],
    rng: random.Random,
) -> list[R]:
    """``candidates``, where there is most room first: the shortest queue (``loads``),
    then the emptiest KV cache (``kv_use``, in steps of ``KV_USE_STEP``), then the one
    sent a call longest ago (``last_sent``, a clock reading; 0 for never); ties at random.

    The last two make new conversations alternate over idle replicas, each new prefix
    going to the replica that took none for longest, rather than piling onto one.
    """
    shuffled = list(candidates)
    rng.shuffle(shuffled)  # sorted() is stable: exact ties stay in this random order
    return sorted(shuffled, key=lambda r: (loads[r], int(kv_use[r] / KV_USE_STEP), last_sent[r]))


def _prompt(pending: PendingRequest) -> tuple[list[int], str | None] | None:
    """Token ids and cache salt of a generate call's request, if it has one: a
    ``GenerateRequest`` (from Derender), a ``RenderedText`` (inline text) or the
    body of ``/inference/v1/generate`` as the client sent it (tokens and text
    output; Generate validates it, so anything but token ids routes by default).

    Multimodal features add block keys the router cannot make: such a request
    routes by default too."""
    if not pending.args:
        return None
    request = pending.args[0]
    if isinstance(request, RenderedText):
        return None if request.multimodal else (request.token_ids, request.cache_salt)
    if isinstance(request, dict):
        token_ids, salt = request.get("token_ids"), request.get("cache_salt")
        if request.get("features") is not None or not _token_ids(token_ids):
            return None
        return token_ids, salt if isinstance(salt, str) else None
    token_ids = getattr(request, "token_ids", None)
    if not isinstance(token_ids, list) or getattr(request, "features", None) is not None:
        return None
    return token_ids, getattr(request, "cache_salt", None)


def _token_ids(value: Any) -> TypeGuard[list[int]]:
    """A list of token ids (ints, not bools), as a client body may or may not hold."""
    return isinstance(value, list) and all(type(t) is int for t in value)


def prefix_routing(
    *, imbalance: int, min_match_ratio: float, stats_period_s: float, engine_events: bool = True
) -> RequestRouterConfig:
    """Serve's router config for Generate with prefix routing."""
    # Ray 2.60 annotates RequestRouterConfig's **kwargs as dict values (pinned_router.py).
    options: dict[str, Any] = {
        "request_router_class": PrefixRouter,
        "request_router_kwargs": {
            "imbalance": imbalance,
            "min_match_ratio": min_match_ratio,
            # What the router sent counts until the engine's report has surely come;
            # without engine reports, it is all there is (bounded by _SENT_BLOCKS_MAX).
            "sent_ttl_s": 3 * stats_period_s + 2.0 if engine_events else 3600.0,
        },
        "request_routing_stats_period_s": stats_period_s,
        "request_routing_stats_timeout_s": max(10.0, 5 * stats_period_s),
    }
    return RequestRouterConfig(**options)
