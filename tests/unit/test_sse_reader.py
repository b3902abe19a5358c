"""The curl trace clock the streaming tests read their deadlines from."""

from __future__ import annotations

import pytest

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
