"""``text_placement: auto`` as pure logic: the share it sends to the tier from host
loads, and each request's placement from the share and the request."""

from __future__ import annotations

import asyncio

import pytest

from deployments.config.graph_config import GraphConfig
from deployments.config.placement import AutoPlacementConfig
from deployments.edge.errors import Refusal
from deployments.edge.placement import requested_placement
from deployments.messages.control import HostLoad
from deployments.messages.replies import RenderedText
from deployments.routing.text_placement import AutoPlacement, PlacementReader, pressure

SETTINGS = AutoPlacementConfig(step=0.25)  # busy 0.85, idle 0.5, margin 0.1


def load(tier: str, busy: float, cpus: list[int], loop: float = 0.0, host: str = "m") -> HostLoad:
    return HostLoad(
        tier=tier, replica=f"{tier}-{cpus}", host=host, cpus=cpus, host_busy=busy, loop_busy=loop
    )


def disjoint(generate: float, derender: float) -> list[HostLoad]:
    """The engine on core 0, the tier on core 1 (bench.offload's disjoint layout)."""
    return [load("generate", generate, [0]), load("derender", derender, [1])]


def request(expected: int | None = 256, parsed: bool = True) -> RenderedText:
    return RenderedText(
        token_ids=[1, 2],
        cache_salt=None,
        multimodal=False,
        job=b"",
        expected_tokens=expected,
        parsed=parsed,
    )


def placements(auto: AutoPlacement, n: int) -> list[str]:
    return [auto.choose(request())[0] for _ in range(n)]


def test_a_busy_engine_host_next_to_an_idle_tier_moves_text_to_the_tier_step_by_step() -> None:
    auto = AutoPlacement(SETTINGS)
    assert placements(auto, 4) == ["inline"] * 4
    auto.observe(disjoint(1.0, 0.4))
    assert auto.share == 0.25
    assert placements(auto, 8).count("tier") == 2
    for _ in range(5):
        auto.observe(disjoint(1.0, 0.4))
    assert auto.share == 1.0
    assert placements(auto, 8) == ["tier"] * 8


def test_a_tier_as_busy_as_the_engine_host_holds_the_share() -> None:
    # Under the tier, its core fills too (bench.offload: 0.97–0.99 at 128 streams): the
    # placement that made it busy must not undo itself.
    auto = AutoPlacement(SETTINGS)
    auto.share = 1.0
    auto.observe(disjoint(1.0, 0.98))
    assert auto.share == 1.0
    # The tier the busier by the margin: text comes back, a step at a time.
    auto.observe(disjoint(0.7, 0.95))
    assert auto.share == 0.75


def test_an_idle_engine_host_takes_the_text_back() -> None:
    auto = AutoPlacement(SETTINGS)
    auto.share = 0.5
    auto.observe(disjoint(0.3, 0.1))
    assert auto.share == 0.25


def test_a_tier_on_the_engines_cores_gets_nothing() -> None:
    # Every process on both cores: the tier's work would land on the engine's CPUs.
    auto = AutoPlacement(SETTINGS)
    auto.share = 1.0
    auto.observe([load("generate", 1.0, [0, 1]), load("derender", 0.2, [0, 1])])
    assert auto.share == 0.0
    assert auto.choose(request()) == ("inline", "shared-cpus")


def test_cpus_of_another_machine_are_the_tiers_own() -> None:
    loads = [load("generate", 1.0, [0, 1], host="gpu"), load("derender", 0.2, [0, 1], host="cpu")]
    assert pressure(loads) is not None and pressure(loads).own_cpus  # type: ignore[union-attr]


def test_a_saturated_event_loop_is_pressure_on_a_host_with_idle_cores() -> None:
    # A GPU host: the engine's core busy, seven idle; the replica's one thread is full.
    auto = AutoPlacement(SETTINGS)
    auto.observe(
        [
            load("generate", 0.2, list(range(8)), loop=0.95, host="gpu"),
            load("derender", 0.3, [0, 1], loop=0.2, host="cpu"),
        ]
    )
    assert auto.share == 0.25


def test_no_reading_from_a_tier_holds_the_share() -> None:
    auto = AutoPlacement(SETTINGS)
    auto.share = 0.5
    auto.observe([load("generate", 1.0, [0])])
    auto.observe([])
    assert auto.share == 0.5


def test_a_short_request_stays_inline_whatever_the_share() -> None:
    auto = AutoPlacement(SETTINGS)
    auto.share = 1.0
    assert auto.choose(request(expected=8, parsed=True)) == ("inline", "short")
    assert auto.choose(request(expected=32, parsed=False)) == ("inline", "short")
    assert auto.choose(request(expected=32, parsed=True))[0] == "tier"
    assert auto.choose(request(expected=None, parsed=False))[0] == "tier"


def test_a_tokens_only_graph_places_every_request_in_the_tier() -> None:
    auto = AutoPlacement(SETTINGS, tokens_only=True)
    assert auto.choose(request(expected=1)) == ("tier", "tokens-only")


def test_the_header_overrides_the_graphs_placement() -> None:
    config = GraphConfig(text_placement="auto")
    assert requested_placement(None, config) == "auto"
    assert requested_placement("Tier", config) == "tier"
    with pytest.raises(Refusal):
        requested_placement("gpu", config)
    with pytest.raises(Refusal):
        requested_placement("inline", GraphConfig(tokens_only=True, text_placement="tier"))
    assert requested_placement("auto", GraphConfig(tokens_only=True, text_placement="tier"))


def test_config_orders_idle_below_busy_and_auto_needs_a_tokenizer() -> None:
    with pytest.raises(ValueError, match="idle must be below"):
        AutoPlacementConfig(idle=0.9, busy=0.8)
    with pytest.raises(ValueError, match="text_placement 'auto'"):
        GraphConfig(tokens_only=True, text_placement="auto")


def test_the_reader_reads_while_requests_come_and_stops_when_they_do_not() -> None:
    async def scenario() -> tuple[int, bool]:
        now = [0.0]
        reads = []

        async def read() -> list[HostLoad]:
            reads.append(now[0])
            return disjoint(1.0, 0.2)

        settings = AutoPlacementConfig(refresh_s=0.01, idle_stop_s=0.05)
        auto = AutoPlacement(settings)
        reader = PlacementReader(auto, read, settings, clock=lambda: now[0])
        reader.touch()
        await asyncio.sleep(0.05)
        now[0] = 1.0  # past idle_stop_s since the last request
        await asyncio.sleep(0.05)
        stopped = reader._task is not None and reader._task.done()
        return len(reads), stopped

    count, stopped = asyncio.run(scenario())
    assert count >= 2 and stopped
