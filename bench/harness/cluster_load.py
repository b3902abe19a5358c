"""Load on a local cluster's graph and what the cluster did meanwhile.

- ``OpenLoop``: streamed chat requests (tier text) issued at seeded open-loop
  times (``bench.arrivals``), each read by its own curl (``sse_reader``), so
  the readers cost the cluster's host almost nothing.
- ``Timeline``: every second, Ray's state API: alive nodes per node group and
  alive Serve replicas per deployment and node group.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.arrivals import Phase, arrival_times
from bench.harness.cluster import LocalCluster
from bench.harness.sse_reader import Stream

TIER = {"X-Text-Placement": "tier"}


def chat_body(model: str, max_tokens: int, index: int) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": f"Count to a thousand, request {index}."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,  # every stream as long as asked: a steady load per request
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def outcome(stream: Stream) -> str:
    """``ok``: finished, ``[DONE]``; ``error event``: an error event, then ``[DONE]``;
    ``aborted``: finish reason abort, then ``[DONE]``; anything else says how it broke."""
    if stream.error:
        return f"broken: {stream.error}"
    events = stream.events
    if not events or events[-1] != "[DONE]":
        return f"broken: no [DONE] after {len(events)} events"
    if any(isinstance(e, dict) and "error" in e for e in events):
        return "error event"
    reasons = stream.finish_reasons()
    if reasons == ["abort"]:
        return "aborted"
    if reasons not in (["length"], ["stop"]):
        return f"broken: finish reasons {reasons}"
    return "ok"


def engine_requests(base_url: str) -> float:
    """Requests the engines hold, running or waiting (the graph's /metrics)."""
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    pattern = r"^vllm:num_requests_(?:running|waiting)(?:\{[^}]*\})? (\S+)$"
    return sum(float(v) for v in re.findall(pattern, text, flags=re.M))


@dataclass
class Sent:
    stream: Stream
    sent_at: float


class OpenLoop:
    """Requests at ``arrival_times(phases)`` from ``start()`` on, in a thread of its own."""

    def __init__(
        self, base_url: str, model: str, phases: list[Phase], max_tokens: int, seed: int = 0
    ):
        self._base_url = base_url
        self._model = model
        self._times = arrival_times(phases, poisson=True, seed=seed)
        self._max_tokens = max_tokens
        self.sent: list[Sent] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.started_at = 0.0

    def start(self) -> None:
        self.started_at = time.monotonic()
        self._thread.start()

    def _run(self) -> None:
        for index, at in enumerate(self._times):
            if self._stop.wait(max(0.0, self.started_at + at - time.monotonic())):
                return
            stream = Stream(
                self._base_url,
                "/v1/chat/completions",
                chat_body(self._model, self._max_tokens, index),
                TIER,
            )
            stream.start()
            self.sent.append(Sent(stream, time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def join(self, timeout_s: float) -> None:
        """Wait for the schedule to end, then for every stream to end."""
        self._thread.join(timeout_s)
        deadline = time.monotonic() + timeout_s
        for sent in list(self.sent):
            sent.stream.join(max(0.0, deadline - time.monotonic()))


@dataclass
class Sample:
    t: float
    nodes: dict[str, int]
    replicas: dict[str, dict[str, int]]
    """deployment → node group → alive replicas."""


@dataclass
class Timeline:
    cluster: LocalCluster
    period_s: float = 1.0
    samples: list[Sample] = field(default_factory=list)
    started_at: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self, started_at: float | None = None) -> None:
        self.started_at = time.monotonic() if started_at is None else started_at
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            with contextlib.suppress(Exception):  # a node dying mid-query: next sample
                self.samples.append(self.sample())

    def sample(self) -> Sample:
        nodes = self.cluster.nodes()
        group_of = {n["node_id"]: n["group"] for n in nodes}
        replicas: dict[str, dict[str, int]] = {}
        for replica in self.cluster.replicas():
            by_group = replicas.setdefault(replica["deployment"], {})
            group = group_of.get(replica["node_id"], "?")
            by_group[group] = by_group.get(group, 0) + 1
        counts: dict[str, int] = {}
        for group in group_of.values():
            counts[group] = counts.get(group, 0) + 1
        return Sample(time.monotonic() - self.started_at, counts, replicas)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
