"""The clocks the streaming tests read their deadlines from: curl's trace and Serve's log."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from tests.support.serve_log import ingress_finished_at
from tests.support.sse_reader import TRACE_TIME, transfer_end


def test_transfer_end_takes_fractions_from_the_stamps_and_seconds_from_the_spawn() -> None:
    # Spawned at monotonic 1000.95; curl's first line at 1000.98 is stamped
    # a whole second off (…:07.98 rather than …:06.98); 2.5 s later it ends.
    end = transfer_end(1000.95, ("17", "54", "07.980000"), ("17", "54", "10.480000"))
    assert end == pytest.approx(1003.48)


def test_transfer_end_when_curl_starts_in_the_next_second() -> None:
    end = transfer_end(1000.95, ("17", "54", "07.050000"), ("17", "54", "07.250000"))
    assert end == pytest.approx(1001.25)


def test_transfer_end_across_midnight() -> None:
    end = transfer_end(5.0, ("23", "59", "59.500000"), ("00", "00", "00.700000"))
    assert end == pytest.approx(6.7)


def test_trace_time_finds_each_stamped_line() -> None:
    trace = (
        "17:54:13.101010 * Connected to 127.0.0.1\n"
        "17:54:13.101200 > POST /v1/chat/completions HTTP/1.1\n"
        "> Content-Type: application/json\n"
        "17:54:14.900000 * Connection #0 to host 127.0.0.1 left intact\n"
    )
    assert [h + m + s for h, m, s in TRACE_TIME.findall(trace)] == [
        "175413.101010",
        "175413.101200",
        "175414.900000",
    ]


def test_ingress_access_line_gives_the_graphs_end_of_a_request(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    log.write_text(
        "\x1b[36m(ServeReplica:default:Generate pid=1)\x1b[0m INFO 2026-11-29 18:21:12,910 "
        "default_Generate k9 1048ea1b -- CALL generate OK 496.2ms\n"
        "\x1b[36m(ServeReplica:default:Ingress pid=2)\x1b[0m INFO 2026-11-29 18:21:12,913 "
        "default_Ingress ty 1048ea1b -- POST /inference/v1/generate 200 511.4ms\n"
    )
    at = datetime.datetime(2026, 11, 29, 18, 21, 12, 913000).timestamp()
    assert ingress_finished_at(log, "1048ea1b") == pytest.approx(at)
    assert ingress_finished_at(log, "other", timeout_s=0) is None
    assert ingress_finished_at(tmp_path / "none.log", "1048ea1b") is None
