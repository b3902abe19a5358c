"""Prefix routing's pure parts: block keys, the engine's block set, the choice rule, the config.

That the router's keys equal a real engine's is checked against vLLM's own
server in ``tests/integration/test_kv_block_keys.py``; routing on a real
two-replica graph in ``tests/integration/test_prefix_routing.py``.
"""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from ray.serve.request_router import PendingRequest, ReplicaID
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

from deployments.config.graph_config import GenerateOptions, GraphConfig
from deployments.routing.block_keys import (
    BlockEvents,
    BlockKeying,
    decode_events,
    engine_keying,
    event_key,
)
from deployments.routing.engine_blocks import (
    CHANNELS_KEY,
    KV_USE_KEY,
    ROUTING_STATS_KEY,
    EngineBlocks,
)
from deployments.routing.pinned_router import PinnedRouter, avoiding
from deployments.routing.prefix_router import (
    PrefixRouter,
    _Held,
    common_keying,
    prefix_choice,
    room_order,
)
from deployments.transport.serve_internals import PICKING

KEYING = BlockKeying(block_size=4, hash_algo="sha256", seed="vllm-none-hash")


def test_keys_cover_full_blocks_only_and_chain_over_the_prefix() -> None:
    tokens = list(range(100, 111))  # two full blocks and three tokens
    keys = KEYING.keys(tokens)
    assert len(keys) == 2
    # A block's key depends on everything before it: same block, other first block.
    other = KEYING.keys([1, 2, 3, 4, *tokens[4:8]])
    assert other[1] != keys[1]
    # A longer prompt with the same start has the same leading keys.
    assert KEYING.keys([*tokens, 7, 8, 9, 10, 11])[:2] == keys


def test_cache_salt_and_seed_change_every_key() -> None:
    tokens = list(range(16))
    plain = KEYING.keys(tokens)
    salted = KEYING.keys(tokens, cache_salt="tenant-a")
    reseeded = BlockKeying(block_size=4, hash_algo="sha256", seed="0").keys(tokens)
    assert not set(plain) & set(salted)
    assert not set(plain) & set(reseeded)
    assert KEYING.keys(tokens, cache_salt="tenant-a") == salted


def test_event_keys_are_the_low_64_bits_of_a_byte_hash() -> None:
    assert event_key(b"\x00" * 24 + (5).to_bytes(8, "big")) == 5
    assert event_key(b"\xff" * 32) == 2**64 - 1
    assert event_key(42) == 42


def _cache(**kw: object) -> SimpleNamespace:
    base = {"enable_prefix_caching": True, "prefix_caching_hash_algo": "sha256", "block_size": 16}
    return SimpleNamespace(cache_config=SimpleNamespace(**{**base, **kw}))


def test_engine_keying_follows_vllms_seed_rules() -> None:
    assert engine_keying(_cache(), env={}) == BlockKeying(16, "sha256", "vllm-none-hash")
    assert engine_keying(_cache(), env={"PYTHONHASHSEED": "7"}) == BlockKeying(16, "sha256", "7")
    # A random root per engine (xxhash without a seed), or no prefix cache: nothing to route on.
    assert engine_keying(_cache(prefix_caching_hash_algo="xxhash"), env={}) is None
    assert engine_keying(_cache(prefix_caching_hash_algo="xxhash"), env={"PYTHONHASHSEED": "1"})
    assert engine_keying(_cache(enable_prefix_caching=False), env={}) is None


def test_vllm_event_batches_decode_to_keys_in_order() -> None:
    stored = BlockStored(
        block_hashes=[b"\x00" * 31 + b"\x01", 2],
        parent_block_hash=None,
        token_ids=[1, 2, 3, 4, 5, 6, 7, 8],
        block_size=4,
        lora_id=None,
        medium="GPU",
        lora_name=None,
    )
    batch = KVEventBatch(
        ts=0.0, events=[stored, BlockRemoved(block_hashes=[2], medium="GPU"), AllBlocksCleared()]
    )
    events = decode_events(msgspec.msgpack.encode(batch))
    assert events == [
        BlockEvents([1, 2], [], False),
        BlockEvents([], [2], False),
        BlockEvents([], [], True),
    ]


def test_engine_blocks_follow_stored_removed_and_cleared() -> None:
    blocks = EngineBlocks(KEYING)
    blocks.apply([BlockEvents([1, 2, 3], [], False), BlockEvents([], [2], False)])
    assert (1 in blocks, 2 in blocks, 3 in blocks) == (True, False, True)
    first = blocks.routing_stats()
    held = _Held(first)
    assert held.blocks == {1, 3} and held.keying == KEYING
    blocks.apply([BlockEvents([9], [], True)])
    assert len(blocks) == 1 and 9 in blocks
    assert blocks.routing_stats()["version"] > first["version"]


def test_the_longest_match_goes_first() -> None:
    assert prefix_choice(10, {"a": 8, "b": 1}, {"a": 3, "b": 0}, 8, 0.1) == ["a"]
    assert prefix_choice(10, {"a": 8, "b": 8, "c": 0}, {"a": 0, "b": 0, "c": 0}, 8, 0.1) == [
        "a",
        "b",
    ]


def test_no_match_or_a_small_gain_routes_by_load() -> None:
    assert prefix_choice(10, {"a": 0, "b": 0}, {"a": 0, "b": 0}, 8, 0.1) == []
    # One shared template block out of 20 is no reason to pile onto one replica.
    assert prefix_choice(20, {"a": 1, "b": 0}, {"a": 0, "b": 0}, 8, 0.1) == []


def test_a_much_busier_best_replica_routes_by_load() -> None:
    # Within the imbalance the match wins; beyond it, load does.
    assert prefix_choice(10, {"a": 9, "b": 0}, {"a": 11, "b": 3}, 8, 0.1) == ["a"]
    assert prefix_choice(10, {"a": 9, "b": 0}, {"a": 12, "b": 3}, 8, 0.1) == []


def test_a_queue_the_router_has_not_heard_of_is_no_imbalance() -> None:
    assert prefix_choice(10, {"a": 9, "b": 0}, {"a": 11, "b": None}, 8, 0.1) == ["a"]
    assert prefix_choice(10, {"a": 9, "b": 0}, {"a": 12, "b": 3, "c": None}, 8, 0.1) == []
    assert prefix_choice(10, {"a": 9, "b": 0}, {"a": None, "b": 3}, 8, 0.1) == ["a"]


def test_keys_are_named_by_the_last_reported_keying_until_new_replicas_report() -> None:
    other = BlockKeying(block_size=16, hash_algo="sha256", seed="0")
    assert common_keying({KEYING}, other) == KEYING
    # Every replica just replaced, none reported yet: the graph's keying still holds.
    assert common_keying(set(), KEYING) == KEYING
    assert common_keying(set(), None) is None
    # Replicas that disagree (an upgrade mid-way): no keying, route by load.
    assert common_keying({KEYING, other}, KEYING) is None


@pytest.mark.parametrize(
    ("generate", "policy"),
    [
        ({}, "pow2"),
        ({"num_replicas": 2}, "prefix"),
        ({"autoscaling": {"min_replicas": 1, "max_replicas": 3}}, "prefix"),
        ({"num_replicas": 2, "routing": "pow2"}, "pow2"),
        ({"routing": "prefix"}, "prefix"),
    ],
)
def test_prefix_routing_is_the_default_with_more_than_one_replica(
    generate: dict[str, object], policy: str
) -> None:
    config = GraphConfig.from_args({"generate": generate})
    assert isinstance(config.generate, GenerateOptions)
    assert config.generate.routing_policy() == policy


def test_bad_routing_options_name_the_key() -> None:
    with pytest.raises(ValueError, match="routing"):
        GraphConfig.from_args({"generate.routing": "random"})
    with pytest.raises(ValueError, match="min_match_ratio"):
        GraphConfig.from_args({"generate.prefix_routing.min_match_ratio": "2"})


class _Replica:
    """What a router reads of Serve's ``RunningReplica`` (which needs a live actor)."""

    def __init__(self, unique_id: str, stats: dict[str, Any]):
        from ray.serve._private.common import DeploymentID

        self.replica_id = ReplicaID(unique_id, DeploymentID(name="Generate", app_name="default"))
        self.routing_stats = stats
        self.node_id, self.availability_zone = "node", None
        self.multiplexed_model_ids: set[str] = set()
        self.max_ongoing_requests = 256

    async def get_queue_len(self, *, deadline_s: float) -> int:
        return 0


def _call(request_id: str, token_ids: list[int], **kwargs: Any) -> PendingRequest:
    metadata = SimpleNamespace(internal_request_id=request_id, request_id=request_id)
    return PendingRequest(args=[{"token_ids": token_ids}], kwargs=kwargs, metadata=metadata)  # type: ignore[arg-type]


def test_a_turn_routed_while_the_router_knew_one_replica_is_remembered_unless_avoided() -> None:
    """A replica just started that this router has not heard of yet: the first turn
    of a conversation goes to the one it knows, and once it knows both, the next
    turn follows the first there, before that engine has reported what it holds;
    unless the call asks to avoid it (its engine died under the stream)."""

    async def scenario() -> tuple[list[list[Any]], list[list[Any]]]:
        from ray.serve._private.common import DeploymentHandleSource, DeploymentID

        # Serve's RequestRouter takes these two as a handle builds it (its own tests do so).
        router = PrefixRouter(
            deployment_id=DeploymentID(name="Generate", app_name="default"),
            handle_source=DeploymentHandleSource.UNKNOWN,
        )
        router.initialize_state(imbalance=8, min_match_ratio=0.1, sent_ttl_s=60.0)
        reported = {ROUTING_STATS_KEY: EngineBlocks(KEYING).routing_stats()}  # holds nothing
        old, new = _Replica("old", reported), _Replica("new", {})
        router.update_replicas([old])  # type: ignore[list-item]
        first_turn = list(range(40))
        first = _call("turn-1", first_turn)
        assert await router.choose_replicas([old], first) != []  # type: ignore[list-item]
        router.on_request_routed(first, old.replica_id, None)
        router.update_replicas([old, new])  # type: ignore[list-item]
        second = _call("turn-2", [*first_turn, *range(100, 120)])
        ranks = await router.choose_replicas([old, new], second)  # type: ignore[list-item]
        # A call that asks to avoid a replica (its engine died under the stream)
        # goes elsewhere, whatever that replica holds.
        moved = _call("turn-2-moved", [*first_turn, *range(100, 120)], **avoiding(("old",)))
        return ranks, await router.choose_replicas([old, new], moved)  # type: ignore[list-item]

    ranks, moved = asyncio.run(scenario())
    assert [r.replica_id.unique_id for r in ranks[0]] == ["old"], ranks
    assert {r.replica_id.unique_id for rank in moved for r in rank} == {"new"}, moved


def _order(
    loads: dict[str, int], kv: dict[str, float], last: dict[str, float], seed: int = 0
) -> str:
    return "".join(room_order(sorted(loads), loads, kv, last, random.Random(seed)))


def test_a_prompt_no_replica_holds_goes_where_there_is_room() -> None:
    idle = {"a": 0.0, "b": 0.0}
    # The shortest queue first, whatever else.
    assert _order({"a": 2, "b": 1}, {"a": 0.0, "b": 0.9}, {"a": 0.0, "b": 9.0}) == "ba"
    # Equal queues: the emptier KV cache; a few points apart is a tie.
    assert _order({"a": 1, "b": 1}, {"a": 0.40, "b": 0.10}, idle) == "ba"
    assert _order({"a": 1, "b": 1}, {"a": 0.01, "b": 0.03}, {"a": 1.0, "b": 2.0}) == "ab"
    # Then the replica this router sent to least recently (never: first).
    assert _order({"a": 0, "b": 0}, idle, {"a": 5.0, "b": 3.0}) == "ba"
    assert _order({"a": 0, "b": 0}, idle, {"a": 5.0, "b": 0.0}) == "ba"


def test_exact_ties_break_at_random() -> None:
    tied = {r: 0 for r in "abc"}
    firsts = {_order(tied, dict.fromkeys(tied, 0.0), dict.fromkeys(tied, 0.0), seed)[0]
              for seed in range(40)}  # fmt: skip
    assert firsts == {"a", "b", "c"}


def _router(**state: Any) -> PrefixRouter:
    from ray.serve._private.common import DeploymentHandleSource, DeploymentID

    # Serve's RequestRouter takes these two as a handle builds it (its own tests do so).
    router = PrefixRouter(
        deployment_id=DeploymentID(name="Generate", app_name="default"),
        handle_source=DeploymentHandleSource.UNKNOWN,
    )
    router.initialize_state(**{"imbalance": 8, "min_match_ratio": 0.1, "sent_ttl_s": 60.0, **state})
    return router


def test_interleaved_new_conversations_spread_over_idle_replicas_and_stick() -> None:
    """Issue 65's case: eight conversations, each over a system prompt of its own,
    four turns each, turns interleaved, one call at a time, on two idle replicas
    (equal queues). With Serve's power of two, the replica whose queue length Serve
    held from the last call took every first turn (all 32 on one in one run)."""

    async def scenario() -> dict[int, list[str]]:
        router = _router()
        reported = {ROUTING_STATS_KEY: EngineBlocks(KEYING).routing_stats(), KV_USE_KEY: 0.0}
        replicas = [_Replica("a", reported), _Replica("b", reported)]
        router.update_replicas(replicas)  # type: ignore[arg-type]
        served: dict[int, list[str]] = {c: [] for c in range(8)}
        prompts = {c: [*range(1000 * (c + 1), 1000 * (c + 1) + 40)] for c in served}
        for turn in range(4):
            for c in served:
                prompts[c] += [7] * 8  # the turn's question and answer
                call = _call(f"c{c}-t{turn}", prompts[c])
                ranks = await router.choose_replicas(replicas, call)  # type: ignore[arg-type]
                chosen = ranks[0][0]
                router.on_request_routed(call, chosen.replica_id, None)
                served[c].append(chosen.replica_id.unique_id)
        return served

    served = asyncio.run(scenario())
    assert all(len(set(turns)) == 1 for turns in served.values()), served
    homes = [turns[0] for turns in served.values()]
    assert min(homes.count("a"), homes.count("b")) >= 2, homes


def test_a_held_prefix_still_goes_first_and_room_follows() -> None:
    async def scenario() -> list[list[str]]:
        router = _router()
        stats = {ROUTING_STATS_KEY: EngineBlocks(KEYING).routing_stats(), KV_USE_KEY: 0.0}
        replicas = [_Replica("a", stats), _Replica("b", stats), _Replica("c", stats)]
        router.update_replicas(replicas)  # type: ignore[arg-type]
        first = _call("t1", list(range(40)))
        await router.choose_replicas(replicas, first)  # type: ignore[arg-type]
        router.on_request_routed(first, replicas[1].replica_id, None)  # Serve sent it to b
        ranks = await router.choose_replicas(replicas, _call("t2", list(range(48))))  # type: ignore[arg-type]
        return [[r.replica_id.unique_id for r in rank] for rank in ranks]

    ranks = asyncio.run(scenario())
    # The replica holding the prefix, then every replica one rank each, by room ("b"
    # was just sent a call: last among equals).
    assert ranks[0] == ["b"] and [r for [r] in ranks[1:]][-1] == "b", ranks
    assert sorted(r for [r] in ranks[1:]) == ["a", "b", "c"], ranks


def test_the_kv_cache_use_engines_report_orders_equal_queues() -> None:
    async def scenario() -> list[str]:
        router = _router()
        blocks = EngineBlocks(KEYING).routing_stats()
        full = _Replica("full", {ROUTING_STATS_KEY: blocks, KV_USE_KEY: 0.6})
        empty = _Replica("empty", {ROUTING_STATS_KEY: blocks, KV_USE_KEY: 0.02})
        starting = _Replica("starting", {ROUTING_STATS_KEY: blocks, KV_USE_KEY: None})
        router.update_replicas([full, empty, starting])  # type: ignore[list-item]
        for name, replica in (("empty", empty), ("starting", starting)):
            call = _call(f"earlier-{name}", list(range(500, 540)))
            await router.choose_replicas([full, empty, starting], call)  # type: ignore[list-item]
            router.on_request_routed(call, replica.replica_id, None)
        ranks = await router.choose_replicas(  # type: ignore[list-item]
            [full, empty, starting], _call("new", list(range(40)))
        )
        return [rank[0].replica_id.unique_id for rank in ranks]

    # "starting" has reported no reading yet (counts as empty), "empty" reads 0.02 (a tie):
    # both ahead of "full", the one sent to longer ago first.
    assert asyncio.run(scenario()) == ["empty", "starting", "full"]


def test_the_step_channels_a_replica_reports_are_not_load() -> None:
    """Serve counts each caller's step channel as an ongoing request; a replica that
    more callers hold channels to is no busier for it."""

    async def scenario() -> list[str]:
        router = _router()
        blocks = EngineBlocks(KEYING).routing_stats()
        held = _Replica("held", {ROUTING_STATS_KEY: blocks, KV_USE_KEY: 0.0, CHANNELS_KEY: 3})
        busy = _Replica("busy", {ROUTING_STATS_KEY: blocks, KV_USE_KEY: 0.0, CHANNELS_KEY: 1})
        router.update_replicas([held, busy])  # type: ignore[list-item]
        router.replica_queue_len_cache.update(held.replica_id, 3)  # its channels alone
        router.replica_queue_len_cache.update(busy.replica_id, 2)  # a channel and a request
        ranks = await router.choose_replicas([held, busy], _call("new", list(range(40))))  # type: ignore[list-item]
        return [rank[0].replica_id.unique_id for rank in ranks]

    assert asyncio.run(scenario()) == ["held", "busy"]


def test_a_pick_weighs_the_picking_callers_requests_in_flight_and_is_remembered() -> None:
    """A request channel's pick (``serve_internals.pick_replica``): Serve's router hears
    of no request it only picked, so its queue lengths stay unknown; the caller's own
    requests in flight, passed with the pick, are the load, and the pick counts as a
    send (the next turn of the conversation follows it)."""

    async def scenario() -> tuple[str, str, str]:
        router = _router()
        stats = {ROUTING_STATS_KEY: EngineBlocks(KEYING).routing_stats(), KV_USE_KEY: 0.0}
        replicas = [_Replica("a", stats), _Replica("b", stats)]
        router.update_replicas(replicas)  # type: ignore[arg-type]
        busy_a = {PICKING: {"a": 3, "b": 0}}
        first = await router.choose_replicas(replicas, _call("t1", list(range(40)), **busy_a))  # type: ignore[arg-type]
        # The conversation's next turn, picked: it follows the first (b) while b is not
        # much busier (imbalance 8), and leaves it when b is.
        turn = [*range(40), *range(100, 108)]
        near = await router.choose_replicas(replicas, _call("t2", turn, **{PICKING: {"b": 5}}))  # type: ignore[arg-type]
        far = await router.choose_replicas(replicas, _call("t3", turn, **{PICKING: {"b": 20}}))  # type: ignore[arg-type]
        return (
            first[0][0].replica_id.unique_id,
            near[0][0].replica_id.unique_id,
            far[0][0].replica_id.unique_id,
        )

    assert asyncio.run(scenario()) == ("b", "b", "a")


def test_a_pinned_routers_pick_takes_the_less_loaded_of_its_two() -> None:
    async def scenario() -> set[str]:
        from ray.serve._private.common import DeploymentHandleSource, DeploymentID

        router = PinnedRouter(
            deployment_id=DeploymentID(name="Generate", app_name="default"),
            handle_source=DeploymentHandleSource.UNKNOWN,
        )
        router.initialize_state()
        replicas = [_Replica("a", {}), _Replica("b", {})]
        router.update_replicas(replicas)  # type: ignore[arg-type]
        firsts = set()
        for i in range(20):
            ranks = await router.choose_replicas(  # type: ignore[arg-type]
                replicas, _call(f"p{i}", [1], **{PICKING: {"a": 4, "b": 1}})
            )
            firsts.add(ranks[0][0].replica_id.unique_id)
        return firsts

    assert asyncio.run(scenario()) == {"b"}
