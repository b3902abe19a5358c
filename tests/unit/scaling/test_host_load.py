"""A replica's host load from /proc, with fake readers and clocks."""

from __future__ import annotations

from deployments.scaling.host_load import HostSampler, read_cpu_times

STAT = """cpu  300 0 100 600 0 0 0 0 0 0
cpu0 100 0 50 100 0 0 0 0 0 0
cpu1 200 0 50 500 0 0 0 0 0 0
intr 12345
"""


def test_cpu_times_count_only_the_allowed_cpus() -> None:
    assert read_cpu_times(frozenset({0}), STAT) == (150.0, 250.0)
    assert read_cpu_times(frozenset({0, 1}), STAT) == (400.0, 1000.0)


def sampler(state: dict[str, object]) -> HostSampler:
    return HostSampler(
        "generate",
        "r",
        affinity=lambda: state["cpus"],  # type: ignore[arg-type,return-value]
        cpu_times=lambda cpus: state["times"],  # type: ignore[arg-type,return-value]
        thread_ns=lambda: state["ns"],  # type: ignore[arg-type,return-value]
        clock=lambda: state["now"],  # type: ignore[arg-type,return-value]
    )


def test_a_reading_covers_the_window_since_the_last() -> None:
    state: dict[str, object] = {"cpus": {0}, "times": (0.0, 0.0), "ns": 0.0, "now": 0.0}
    host = sampler(state)
    assert host.reading() is None  # no window yet
    state.update(times=(90.0, 100.0), ns=0.5e9, now=1.0)
    first = host.reading()
    assert first is not None and first.cpus == [0]
    assert (first.host_busy, first.loop_busy) == (0.9, 0.5)
    state.update(times=(95.0, 200.0), ns=0.6e9, now=1.2)  # too soon: the same reading
    assert host.reading() == first
    state.update(now=2.0)
    later = host.reading()
    assert later is not None and abs(later.host_busy - 0.05) < 1e-9
    assert abs(later.loop_busy - 0.1) < 1e-9


def test_a_replica_pinned_elsewhere_says_so_at_once_and_starts_a_new_window() -> None:
    state: dict[str, object] = {"cpus": {0, 1}, "times": (0.0, 0.0), "ns": 0.0, "now": 0.0}
    host = sampler(state)
    host.reading()
    state.update(times=(50.0, 100.0), now=1.0)
    assert host.reading().host_busy == 0.5  # type: ignore[union-attr]
    state.update(cpus={1}, times=(60.0, 200.0), now=2.0)
    moved = host.reading()
    # Its new CPUs at once; the busy share is the last window's until one on them ends.
    assert moved is not None and moved.cpus == [1] and moved.host_busy == 0.5
    state.update(times=(150.0, 300.0), now=3.0)
    reading = host.reading()
    assert reading is not None and reading.cpus == [1] and abs(reading.host_busy - 0.9) < 1e-9
