"""Abort by id: concurrent long streams on both Generate replicas, in every output mode and
placement; the aborted ones end with ``abort``, the others run to their length.

What is checked is behaviour, not speed, so it holds on any host: the abort's
answer comes once every engine has let go of the ids (vLLM's output processor
drops them before the answer), so the very next ``/metrics`` read must not
count them, and each aborted stream ends with ``abort`` long before its paced
length. How fast an abort lands is a benchmark's question, not a test's.
"""

from __future__ import annotations

import httpx
import pytest

from bench.harness.sse_reader import Stream, start_together
from tests.integration.test_failure_semantics import (
    HANG_GUARD_S,
    long_body,
    running_requests,
    wait_idle,
)

# Paced streams (bench/harness/paced_decode.py): at full speed the tiny engine
# makes ~2,000 tokens/s per stream, so three of them finish before an abort can
# reach them and flood Serve's one HTTP proxy on this 2-core host. Paced, each
# doomed stream lasts at least TOKENS × PACE_MS (8 s) on any host and costs next
# to nothing; the kept one, which runs to its length, at least KEPT_TOKENS ×
# KEPT_PACE_MS (5 s): running when the abort goes out, done soon after.
TOKENS = 1000
PACE_MS = 8
KEPT_TOKENS = 200
KEPT_PACE_MS = 25


@pytest.mark.parametrize("kind", ["tokens", "text", "derender", "inline", "tier"])
def test_abort_by_id_ends_streams_and_frees_engines(client: httpx.Client, kind: str) -> None:
    path, body, headers = long_body(kind, client, tokens=TOKENS, pace_ms=PACE_MS)
    _, kept_body, _ = long_body(kind, client, tokens=KEPT_TOKENS, pace_ms=KEPT_PACE_MS)
    # Each rendered request gets its own id, as three separate clients' would.
    bodies = [
        {**b, "request_id": f"{b['request_id']}-{i}"} if "request_id" in b else b
        for i, b in enumerate([body, body, kept_body])
    ]
    streams = [Stream(str(client.base_url), path, b, headers) for b in bodies]
    start_together(streams)
    doomed, kept = streams[:2], streams[2:]
    # Only the doomed must be running when the abort goes out; a loaded host
    # may start the kept one seconds later (seen in CI), and it need not wait.
    for s in doomed:
        assert s.wait_first(60) and s.error is None, s.error
    response = client.post(
        "/inference/v1/abort_requests", json={"request_ids": [s.stream_id for s in doomed]}
    )
    assert response.status_code == 200, response.text
    # Answered means let go: at most the kept stream is still running.
    assert sum(running_requests(client).values()) <= len(kept), response.text
    for s in streams:
        s.join(120)
        assert s.error is None, s.error
        assert s.events[-1] == "[DONE]"
    for s in doomed:
        assert s.finish_reasons() == ["abort"], (response.text, s.stream_id, s.events[-3:])
        assert s.token_count() < TOKENS, s.token_count()  # -1: no usage event
    for s in kept:
        assert s.finish_reasons() == ["length"]
        assert s.token_count() == KEPT_TOKENS
    assert len(running_requests(client)) == 2  # both Generate replicas report
    wait_idle(client, within_s=HANG_GUARD_S)
