"""bench.offload's pieces: pinning processes to cores (real processes, read back from
/proc), the report's ratios, and a stream's timing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest

from bench.harness.pinning import (
    HEAD,
    NODE_TYPE_VARIABLE,
    allowed_cores,
    bind_engine,
    by_group,
    cores_text,
    engine_processes,
    pin,
    set_cores,
)
from bench.harness.timed_stream import TimedStream
from bench.offload.report import moving_rows, ratio_rows
from bench.offload.study import check_pinning

# A process with a second thread, which forks a child when it reads a line.
FORKER = """
import subprocess, sys, threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print("ready", flush=True)
sys.stdin.readline()
child = subprocess.Popen(["sleep", "60"])
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.fixture
def forker() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", FORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    try:
        yield proc
    finally:
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.wait()


def test_set_cores_moves_every_thread_and_what_the_process_starts_after(
    forker: subprocess.Popen[str],
) -> None:
    one = min(os.sched_getaffinity(0))
    assert len(list(Path(f"/proc/{forker.pid}/task").iterdir())) >= 2
    set_cores(forker.pid, {one})
    assert allowed_cores(forker.pid) == str(one)  # every thread: one list, not two
    assert forker.stdin is not None and forker.stdout is not None
    forker.stdin.write("go\n")
    forker.stdin.flush()
    child = int(forker.stdout.readline())
    assert allowed_cores(child) == str(one)


def test_allowed_cores_lists_threads_that_differ_apart(forker: subprocess.Popen[str]) -> None:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("one core: no two affinities to tell apart")
    tasks = sorted(int(t.name) for t in Path(f"/proc/{forker.pid}/task").iterdir())
    os.sched_setaffinity(tasks[-1], {cores[0]})
    assert " | " in allowed_cores(forker.pid)


@contextmanager
def titled_children(*titles: str) -> Iterator[psutil.Process]:
    """A process whose children carry ``titles`` (as vLLM titles its engine's), up."""
    script = " ".join(f"(exec -a {title} sleep 60) &" for title in titles) + " wait"
    server = subprocess.Popen(["bash", "-c", script])
    root = psutil.Process(server.pid)
    try:
        for _ in range(100):
            if len(root.children()) == len(titles):
                break
            time.sleep(0.05)  # up to 10 s for the parent to start and its child to end
        yield root
    finally:
        for child in root.children(recursive=True):
            child.kill()
        server.kill()
        server.wait()


def test_bind_engine_binds_vllms_engine_processes_only() -> None:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("one core: no binding to tell apart")
    with titled_children("VLLM::EngineCore", "other") as root:
        assert bind_engine(root.pid, [cores[0]]) == 1
        by_title = {c.cmdline()[0]: c.pid for c in root.children()}
        assert allowed_cores(by_title["VLLM::EngineCore"]) == str(cores[0])
        assert allowed_cores(by_title["other"]) != str(cores[0])
        assert allowed_cores(root.pid) != str(cores[0])
    with titled_children("other") as root, pytest.raises(LookupError):
        bind_engine(root.pid, [cores[0]])


def test_engine_processes_finds_vllms_engine_core_and_worker_by_title() -> None:
    with titled_children("VLLM::EngineCore", "VLLM::Worker", "other") as root:
        core, worker = engine_processes(root.pid)
        assert core.cmdline()[0] == "VLLM::EngineCore"
        assert worker.cmdline()[0] == "VLLM::Worker"
    with titled_children("VLLM::EngineCore") as root, pytest.raises(LookupError):
        engine_processes(root.pid)  # no worker


def test_engine_lookups_pass_over_zombies() -> None:
    """A test process (this suite's) holds children it has not reaped yet."""
    script = "import subprocess, time; subprocess.Popen(['true']); time.sleep(60)"
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        for _ in range(200):
            children = psutil.Process(parent.pid).children()
            if children and children[0].status() == psutil.STATUS_ZOMBIE:
                break
            time.sleep(0.05)  # up to 10 s for the parent to start and its child to end
        else:
            pytest.fail("no zombie child")
        with pytest.raises(LookupError):
            bind_engine(parent.pid, [0])
        with pytest.raises(LookupError):
            engine_processes(parent.pid)
    finally:
        parent.kill()
        parent.wait()


def test_by_group_gives_a_worker_raylet_and_its_descendants_its_node_group(
    tmp_path: Path,
) -> None:
    raylet_binary = tmp_path / "raylet"  # the name the process table shows
    shutil.copy("/bin/bash", raylet_binary)
    env = {**os.environ, NODE_TYPE_VARIABLE: "engine"}
    raylet = subprocess.Popen([str(raylet_binary), "-c", "sleep 60 & wait"], env=env)
    other = subprocess.Popen(["sleep", "60"])
    try:
        node = psutil.Process(raylet.pid)
        for _ in range(100):
            if node.children():
                break
            time.sleep(0.05)  # up to 10 s for the parent to start and its child to end
        (child,) = node.children()
        processes = [node, child, psutil.Process(other.pid)]
        assert by_group(processes) == {raylet.pid: "engine", child.pid: "engine", other.pid: HEAD}
        one = min(os.sched_getaffinity(0))
        pin(processes, {"engine": {one}, HEAD: os.sched_getaffinity(0)})
        assert allowed_cores(child.pid) == str(one)
        assert allowed_cores(other.pid) == cores_text(os.sched_getaffinity(0))
    finally:
        for proc in (raylet, other):
            for child_ in psutil.Process(proc.pid).children(recursive=True):
                child_.kill()
            proc.kill()
            proc.wait()


def test_cores_text_is_the_kernels_list_form() -> None:
    assert cores_text({0}) == "0"
    assert cores_text({0, 1, 2, 5}) == "0-2,5"


def test_check_pinning_fails_a_process_off_its_cores() -> None:
    cores = {"engine": {0}, HEAD: {1}}
    check_pinning([{"group": "engine", "cores": "0"}, {"group": HEAD, "cores": "1"}], cores)
    with pytest.raises(RuntimeError, match="off their cores"):
        check_pinning([{"group": "engine", "cores": "0-1"}], cores)


def _round(
    streams: int, placement: str, tpot: float, wall_s: float, placed: str | None = None
) -> dict[str, Any]:
    request = {"ttft_ms": 10.0, "tpot_ms": tpot, "tokens": 100, "ok": True}
    requests = [{**request, "placed": placed or placement}] * streams
    return {"layout": "disjoint", "pace_ms": 15.0, "streams": streams, "placement": placement,
            "wall_s": wall_s, "requests": requests, "cpu_s": {}}  # fmt: skip


def test_ratio_rows_compare_s_with_i_pooled_and_round_by_round() -> None:
    data = {
        "rounds": [
            _round(4, "inline", 20.0, 2.0),
            _round(4, "tier", 10.0, 1.0),
            _round(4, "tier", 15.0, 1.0),
            _round(4, "inline", 20.0, 2.0),
        ]
    }
    (row,) = ratio_rows(data)
    # Pooled p50 12.5 ÷ 20; rounds 0.50 and 0.75; tokens/s 400 ÷ 200.
    assert row == "| disjoint | 15 | 4 | 0.62× | 0.50–0.75 | 2.00× | 1.00× | – | – | – |"


def test_auto_is_judged_against_the_better_placement_of_its_cell() -> None:
    data = {
        "rounds": [
            _round(4, "inline", 20.0, 2.0),
            _round(4, "tier", 10.0, 1.0),
            _round(4, "auto", 10.5, 1.0, placed="tier"),
            _round(4, "auto", 12.0, 1.25, placed="inline"),
        ]
    }
    (row,) = ratio_rows(data)
    # A's pooled p50 11.25 ÷ S's 10; tokens/s (400 + 320) ÷ 2 ÷ S's 400; half in the tier.
    assert row.endswith("| 1.12× (no) | 0.90× | 50% |"), row


def test_the_moving_load_compares_each_phase_and_shows_how_fast_auto_moved() -> None:
    def phase(placement: str, tpot: float, placed: list[str]) -> dict[str, Any]:
        requests = [
            {"ttft_ms": 10.0, "tpot_ms": tpot, "tokens": 100, "ok": True, "placed": p,
             "start_s": float(i * 3)}
            for i, p in enumerate(placed)
        ]  # fmt: skip
        return {"placement": placement, "phase": 1, "layout": "disjoint", "wall_s": 10.0,
                "requests": requests}  # fmt: skip

    data = {
        "moving": [
            phase("inline", 20.0, ["inline"] * 4),
            phase("tier", 10.0, ["tier"] * 4),
            phase("auto", 10.8, ["inline", "inline", "tier", "tier"]),
        ]
    }
    (row,) = moving_rows(data)
    # Starts at 0, 3, 6, 9 s: the two in the first 5 s inline, the rest in the tier.
    assert row == (
        "| 1 | disjoint | 20.0 | 10.0 | 10.8 | 1.08× (yes) | 40 | 40 | 40 | 0% | 100% "
        "| 4 / 4 / 4 of 4 / 4 / 4 |"
    )


def test_a_stream_times_tpot_from_its_first_text_to_its_end() -> None:
    # Text stopped at 0.6 s (a parser held the rest back); the stream ended at 2.6 s.
    timed = TimedStream(started=0.0, first=0.1, last=0.6, ended=2.6, tokens=101, ok=True)
    assert timed.ttft_ms == pytest.approx(100.0)
    assert timed.tpot_ms == pytest.approx(25.0)
    assert timed.text_tpot_ms == pytest.approx(5.0)
    assert TimedStream(0.0, 0.1, 2.6, 2.6, 101, ok=False).tpot_ms is None


def test_experiments_md_carries_the_offload_table_read_from_its_results(tmp_path: Path) -> None:
    from bench.doc import offload_section

    results = tmp_path / "docs" / "offload"
    results.mkdir(parents=True)
    rounds = [_round(4, "inline", 20.0, 2.0), _round(4, "tier", 10.0, 1.0)]
    (results / "results.json").write_text(json.dumps({"rounds": rounds}))
    section = offload_section(results, tmp_path / "docs" / "experiments.md")
    assert "| disjoint | 15 | 4 | 0.50× | 0.50–0.50 | 2.00× | 1.00× |" in section
    assert "[offload.md](offload.md)" in section
    assert "![TPOT and cores](offload.png)" in section


def test_the_page_lists_the_runs_kept_beside_its_results(tmp_path: Path) -> None:
    from bench.offload.report import runs_section

    rounds = [_round(4, "inline", 20.0, 2.0), _round(4, "tier", 10.0, 1.0)]
    (tmp_path / "run-i-s-1.json").write_text(json.dumps({"rounds": rounds}))
    with_auto = [*rounds, _round(4, "auto", 11.0, 1.0, placed="tier")]
    (tmp_path / "run-auto-1.json").write_text(json.dumps({"rounds": with_auto}))
    (tmp_path / "results.json").write_text(json.dumps({"rounds": rounds}))  # this run: not listed
    rows = [line for line in runs_section(tmp_path) if line.startswith("| run-")]
    assert rows == [
        "| run-auto-1 | disjoint | 15 | 4 | 0.50× | 1.10× |",
        "| run-i-s-1 | disjoint | 15 | 4 | 0.50× | – |",
    ]


def test_a_step_with_cpu_work_is_labelled_so_and_older_results_read_as_a_sleep() -> None:
    rounds = [_round(4, "inline", 20.0, 2.0), _round(4, "tier", 10.0, 1.0)]
    (row,) = ratio_rows({"rounds": rounds, "args": {"pace_cpu_ms": 15.0}})
    assert row.startswith("| disjoint | 15 (15 CPU) | 4 | 0.50× |"), row
    (row,) = ratio_rows({"rounds": rounds, "args": {"pace_ms": [15.0]}})  # before the option
    assert row.startswith("| disjoint | 15 | 4 |"), row


def test_the_load_asks_each_stream_for_what_the_run_names() -> None:
    from bench.offload.load import PLAIN, Load
    from bench.offload.study import chat

    body = chat(64, 15.0, Load(pace_cpu_ms=10.0, top_logprobs=5))
    assert body["vllm_xargs"] == {"pace_ms": 15.0, "pace_cpu_ms": 10.0}
    assert (body["logprobs"], body["top_logprobs"]) == (True, 5)
    # No more CPU than the step; a warm-up's unpaced chat asks for none.
    assert chat(64, 8.0, Load(pace_cpu_ms=15.0))["vllm_xargs"]["pace_cpu_ms"] == 8.0
    assert "pace_cpu_ms" not in chat(16, 0, Load(pace_cpu_ms=15.0)).get("vllm_xargs", {})
    plain = chat(64, 15.0, PLAIN)
    assert plain["vllm_xargs"] == {"pace_ms": 15.0} and "logprobs" not in plain
    assert Load(15.0, 5).flags() == " --pace-cpu-ms 15 --top-logprobs 5" and PLAIN.flags() == ""
