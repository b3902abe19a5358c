"""When the graph itself finished a request: its Ingress replica's access log line.

``serve run`` prints every replica's log, each line stamped when it was
written (``INFO 2026-11-29 18:21:12,913 default_Ingress <replica> <request id>
-- POST /inference/v1/generate 200 511.4ms``). The Ingress writes that line once
it has handed on the response's last bytes (Serve's proxy logs the same request
a few ms later), so its stamp is the graph's end of the stream, whatever later
delays a client on a loaded host.
"""

from __future__ import annotations

import datetime
import re
import time
from pathlib import Path

ACCESS_LINE = re.compile(
    r"INFO (?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+_Ingress \S+ (?P<request_id>\S+) -- "
    r"[A-Z]+ \S+ \d{3} "
)


def ingress_finished_at(log_path: Path, request_id: str, timeout_s: float = 15) -> float | None:
    """``time.time()`` at which the Ingress finished ``request_id``, per its access log.

    None if the log has no such line within ``timeout_s`` (replica logs reach
    ``serve run`` a moment after they are written), or there is no log (a graph
    the developer started).
    """
    deadline = time.monotonic() + timeout_s
    while log_path.is_file():
        for match in ACCESS_LINE.finditer(log_path.read_text(errors="replace")):
            if match["request_id"] == request_id:
                stamp = datetime.datetime.strptime(match["at"], "%Y-%m-%d %H:%M:%S,%f")
                return stamp.timestamp()  # the log's local time, as time.time() counts
        if time.monotonic() > deadline:
            return None
        time.sleep(0.2)
    return None
