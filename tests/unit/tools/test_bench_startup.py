"""``python -m bench.startup``'s report: medians and ranges per server, each start."""

from __future__ import annotations

from bench.startup import GRAPH, VLLM, Start, report


def starts() -> list[Start]:
    return [
        Start(f"{GRAPH}, new", 0, 66.6, 1.6, 183.0, 7000.0),
        Start(f"{GRAPH}, old", 0, 92.5, 11.9, 676.0, 7500.0),
        Start(VLLM, 0, 40.0, None, 1200.0, 3000.0),
        Start(f"{GRAPH}, new", 1, 65.8, 1.7, 182.0, 7100.0),
        Start(f"{GRAPH}, old", 1, 78.9, 8.7, 677.0, 7400.0),
        Start(VLLM, 1, 42.0, None, 1210.0, 3100.0),
    ]


def test_each_server_gets_its_median_and_range_over_rounds() -> None:
    text = report(starts(), "python -m bench.startup --rounds 2", "2 CPUs")
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines()}
    assert rows[f"{GRAPH}, new"] == (
        f"| {GRAPH}, new | 66.2 (65.8–66.6) | 1.6 (1.6–1.7) | 182 (182–183) | 7050 (7000–7100) |"
    )
    old = rows[f"{GRAPH}, old"]
    assert old.startswith(f"| {GRAPH}, old | 85.7 (78.9–92.5) | 10.3 (8.7–11.9) |")
    # vLLM's server starts no Ray: no GCS time
    assert rows[VLLM].startswith(f"| {VLLM} | 41.0 (40.0–42.0) | — |")


def test_every_start_is_listed_in_order_with_the_command() -> None:
    text = report(starts(), "python -m bench.startup --rounds 2", "2 CPUs")
    assert "Written by `python -m bench.startup --rounds 2` (2 round(s)" in text
    each = [line for line in text.splitlines() if line.startswith(("| 0 |", "| 1 |"))]
    assert [line.split(" | ")[1] for line in each] == [s.server for s in starts()]
    assert each[2] == f"| 0 | {VLLM} | 40.0 | — | 1200 | 3000 |"
