"""``bench.harness``: a server's whole tree stopped for a block and continued; its port's check."""

from __future__ import annotations

import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from bench.harness.freeze import frozen
from bench.harness.servers import Server, port_is_free

# A parent that starts a child; both busy-wait, so a stopped one shows as stopped.
_TREE = (
    "import subprocess, sys\n"
    "subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
    "while True: pass\n"
)


def _statuses(pids: list[int]) -> set[str]:
    return {psutil.Process(pid).status() for pid in pids}


def test_every_process_of_the_tree_is_stopped_in_the_block_and_continued_after(
    tmp_path: Path,
) -> None:
    process = subprocess.Popen([sys.executable, "-c", _TREE])
    try:
        deadline = time.monotonic() + 30
        while not (children := psutil.Process(process.pid).children()):
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.05)
        pids = [process.pid, children[0].pid]
        server = Server("http://127.0.0.1:1", process, tmp_path / "log")
        with pytest.raises(RuntimeError), frozen(server):
            assert _statuses(pids) == {psutil.STATUS_STOPPED}
            cpu = [psutil.Process(pid).cpu_times().user for pid in pids]
            time.sleep(0.3)
            assert [psutil.Process(pid).cpu_times().user for pid in pids] == cpu
            raise RuntimeError("continued even so")
        assert psutil.STATUS_STOPPED not in _statuses(pids)
    finally:
        for child in psutil.Process(process.pid).children(recursive=True):
            child.kill()
        process.kill()
        process.wait()


def test_no_server_stops_nothing() -> None:
    with frozen(None):
        pass


def test_a_port_is_free_past_its_stopped_servers_connections_but_not_while_one_listens() -> None:
    """A server that closed its side first leaves the port's connections in TIME_WAIT for a
    minute; the servers bind over them (SO_REUSEADDR), and so does the check."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = listener.accept()
    assert not port_is_free(port)
    accepted.close()  # the server's side closes first: its end waits in TIME_WAIT
    client.recv(1)
    client.close()
    listener.close()
    assert port_is_free(port)


def test_the_host_line_names_the_cpu_and_its_vector_width() -> None:
    from bench.harness.host import host_line

    line = host_line()
    assert line.startswith(f"{platform.machine()}, {psutil.cpu_count()} CPUs (")
    assert any(f", {simd})" in line for simd in ("AVX-512", "AVX2", "no AVX2")), line
    assert line.endswith(" GiB")


def test_a_run_from_before_the_cpu_was_recorded_names_machine_and_cpus() -> None:
    from bench.harness.host import recorded_host_line

    assert recorded_host_line({"machine": "x86_64", "cpus": 2}) == "x86_64, 2 CPUs"
    line = "x86_64, 2 CPUs (AMD EPYC, AVX-512), 24 GiB"
    assert recorded_host_line({"machine": "x86_64", "cpus": 2, "line": line}) == line
