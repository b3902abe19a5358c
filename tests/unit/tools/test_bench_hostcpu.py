"""bench.hostcpu's traffic: what each stream of a load asks for."""

from __future__ import annotations

from bench.hostcpu.study import PROMPTS, Load


def test_short_traffic_cycles_the_prompts_at_the_models_defaults() -> None:
    load = Load(streams=8, tokens=16, pace_ms=15)
    bodies = [load.chat(i) for i in range(8)]
    assert [b["messages"][0]["content"] for b in bodies] == PROMPTS * 2
    assert all("seed" not in b and "temperature" not in b for b in bodies)


def test_reasoning_traffic_samples_the_reasoning_prompt_with_or_without_a_seed() -> None:
    unseeded = [Load(6, 16, 15, "reasoning").chat(i) for i in range(6)]
    seeded = [Load(6, 16, 15, "reasoning-seeded").chat(i) for i in range(6)]
    for bodies in (unseeded, seeded):
        assert {b["messages"][0]["content"] for b in bodies} == {PROMPTS[0]}
        assert all(b["temperature"] == 1.0 and b["ignore_eos"] for b in bodies)
    assert all("seed" not in b for b in unseeded)
    assert len({b["seed"] for b in seeded}) == 6  # a seed of its own per request
