"""bench.scaling's report: each phase's replicas, cores and TPOT from its samples."""

from __future__ import annotations

from pathlib import Path

from bench.scaling.report import phase_rows, write_report
from bench.scaling.study import PHASES, SIGNALS, graph_args


def _run() -> dict[str, object]:
    first, second = PHASES[0], PHASES[1]
    ticks = [
        {"t_s": 10.0, "phase": first.name, "replicas": 1, "cores": 0.1},
        {"t_s": 20.0, "phase": first.name, "replicas": 3, "cores": 0.3},
        {"t_s": first.seconds + 5, "phase": second.name, "replicas": 2, "cores": 0.0},
    ]
    stream = {"phase": first.name, "tokens": 120, "ok": True, "ended_s": 9.0}
    requests = [
        {**stream, "started_s": 1.0, "tpot_ms": 10.0},
        {**stream, "started_s": 2.0, "tpot_ms": 30.0},
        {**stream, "started_s": 3.0, "tpot_ms": None, "tokens": 0, "ok": False},
    ]
    starts = [0.0, first.seconds]
    for phase in PHASES[1:]:
        starts.append(starts[-1] + phase.seconds)
    return {"signal": "cpu", "ticks": ticks, "requests": requests, "phase_starts": starts}


def test_a_phase_row_reads_only_that_phases_samples_and_streams() -> None:
    rows = phase_rows(_run())
    assert len(rows) == len(PHASES)
    signal, phase, mean, peak, last, cores, streams, p50, _, rate = rows[0]
    assert (signal, phase, mean, peak, last) == ("cpu", f"1. {PHASES[0].name}", "2.0", "3", "3")
    assert (cores, streams, p50) == ("0.20", "2 / 1", "20.0")
    assert rate == f"{240 / PHASES[0].seconds:.0f}"
    assert rows[1][2:6] == ["2.0", "2", "2", "0.00"] and rows[1][7] == "–"


def test_the_report_names_each_signal_and_writes_its_plot(tmp_path: Path) -> None:
    out = tmp_path / "signals.md"
    write_report({"host": "test", "runs": [_run()]}, out)
    assert out.with_suffix(".png").stat().st_size > 0
    assert "| cpu | 1. slow |" in out.read_text()


def test_both_signals_scale_derender_from_the_same_bounds() -> None:
    policies = {s: graph_args(s)["derender"]["autoscaling"] for s in SIGNALS}
    assert {p["policy"] for p in policies.values()} == {"ongoing_requests", "cpu"}
    bounds = [{k: v for k, v in p.items() if "target" not in k and k != "policy"} for p in
              policies.values()]  # fmt: skip
    assert bounds[0] == bounds[1]
