"""The graph's own metrics: where a request's time goes, tier by tier and hop by hop.

Each is a Ray Serve metric (``ray.serve.metrics``), recorded in the replica where the
thing happens, so it leaves the way Serve's own replica metrics do: through the node's
Ray metrics agent, as ``ray_<name>``, with Serve's ``application``, ``deployment`` and
``replica`` labels (the deployment says which tier measured it). One Prometheus scrape
of the cluster sees them all, and the graph's ``/metrics`` merges them beside each
engine's vLLM metrics (``cluster_metrics.py``). Ray's agent takes each process's
values every ``metrics_report_interval_ms`` (10 s by default).

What each means, and the queries that read them: ``docs/observability.md``.
Recording one value costs 4-6 µs (a Ray worker on this host); a stream pays it per
item in each tier it crosses, a request a few times.

Outside a Serve replica (unit tests, tools) nothing is recorded: ``graph_metrics()``
answers a recorder whose methods do nothing.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, Protocol

# vLLM's request latency buckets (time to first token, e2e), in seconds.
LATENCY_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                   1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]  # fmt: skip
# Gaps between stream items: a GPU step is 5-50 ms; a slow tier shows past it.
GAP_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05,
               0.075, 0.1, 0.25, 0.5, 1.0, 2.5]  # fmt: skip
COUNT_BUCKETS = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0]


class Histogram(Protocol):
    def observe(self, value: float, tags: dict[str, str] | None = None) -> None: ...


class Counter(Protocol):
    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None: ...


class _Nothing:
    """Where no Serve replica runs: records nothing."""

    def observe(self, value: float, tags: dict[str, str] | None = None) -> None:
        pass

    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        pass


NOTHING = _Nothing()


class GraphMetrics:
    """Every metric of the graph, each made on first use in this process."""

    def __init__(self, enabled: bool) -> None:
        self._enabled = enabled

    def _histogram(
        self, name: str, doc: str, buckets: list[float], tags: tuple[str, ...] = ()
    ) -> Histogram:
        if not self._enabled:
            return NOTHING
        from ray.serve import metrics

        # Ray types tag_keys as tuple[str], meaning any length.
        return metrics.Histogram(name, description=doc, boundaries=buckets, tag_keys=tags)  # type: ignore[arg-type,return-value]

    def _counter(self, name: str, doc: str, tags: tuple[str, ...] = ()) -> Counter:
        if not self._enabled:
            return NOTHING
        from ray.serve import metrics

        return metrics.Counter(name, description=doc, tag_keys=tags)  # type: ignore[arg-type,return-value]

    @functools.cached_property
    def unary_call_seconds(self) -> Histogram:
        return self._histogram(
            "scaleout_unary_call_seconds",
            "A unary call from the Ingress, by method, as the tier that answered it "
            "spent it: on Render, a body parsed, validated, templated and tokenized.",
            LATENCY_BUCKETS,
            ("method",),
        )

    @functools.cached_property
    def first_item_seconds(self) -> Histogram:
        return self._histogram(
            "scaleout_first_item_seconds",
            "Ingress: from its call into a tier (callee) to the first item back: queue, "
            "prefill and transport (and, in the tier placement, the tier's own hop to "
            "Generate); kind: stream (first event) or answer (a whole unary answer).",
            LATENCY_BUCKETS,
            ("callee", "kind"),
        )

    @functools.cached_property
    def inter_item_seconds(self) -> Histogram:
        return self._histogram(
            "scaleout_inter_item_seconds",
            "Time between a stream's consecutive items as the deployment that measured "
            "it sees them (Generate: from its engine; Derender: from Generate; Ingress: "
            "to the client). An item carries one step's tokens or more.",
            GAP_BUCKETS,
        )

    @functools.cached_property
    def derender_tokens(self) -> Counter:
        return self._counter(
            "scaleout_derender_tokens_total", "Derender: output tokens turned into text."
        )

    @functools.cached_property
    def derender_cpu_seconds(self) -> Counter:
        return self._counter(
            "scaleout_derender_cpu_seconds_total",
            "Derender: the replica process's CPU time, every thread; divided by "
            "scaleout_derender_tokens_total, the CPU per token.",
        )

    @functools.cached_property
    def channel_batch_items(self) -> Histogram:
        return self._histogram(
            "scaleout_step_channel_batch_items",
            "Step channels: stream events per batch a replica sends its caller.",
            COUNT_BUCKETS,
        )

    @functools.cached_property
    def channel_wait_seconds(self) -> Histogram:
        return self._histogram(
            "scaleout_step_channel_wait_seconds",
            "Step channels: how long a batch's oldest event waited in the outbox.",
            GAP_BUCKETS,
        )

    @functools.cached_property
    def requests_sent(self) -> Counter:
        return self._counter(
            "scaleout_requests_sent_total",
            "Requests a replica sent to a tier, by how: channel (on a request channel the "
            "callee replica opened back), call (a Serve handle call of its own: the replica "
            "Serve's router picked has no channel open, or there are none), refused (sent on "
            "a channel, refused by a full replica, then made a call).",
            ("callee", "via"),
        )

    @functools.cached_property
    def prefix_routing(self) -> Counter:
        return self._counter(
            "scaleout_prefix_routing_total",
            "Prefix-aware routing to Generate, by outcome: prefix (sent where its "
            "prefix is cached), no_match (no replica holds enough of it), "
            "single_candidate, no_prompt (nothing to key: multimodal, a prompt shorter than a "
            "block, a body Generate validates), unkeyed "
            "(the replicas' block keying is not known yet).",
            ("outcome",),
        )

    @functools.cached_property
    def prefix_matched_blocks(self) -> Histogram:
        return self._histogram(
            "scaleout_prefix_matched_blocks",
            "Prefix-aware routing: the leading KV blocks of a prompt the best replica "
            "holds, per request compared across two replicas or more.",
            [0.5, *COUNT_BUCKETS],  # Ray takes no bound ≤ 0: none matched is ≤ 0.5,
        )

    @functools.cached_property
    def refusals(self) -> Counter:
        return self._counter(
            "scaleout_refusals_total",
            "Ingress: answers with an error status, by status (4xx bad input, 503 "
            "overload or no replica), before or instead of a stream.",
            ("status",),
        )

    @functools.cached_property
    def stream_errors(self) -> Counter:
        return self._counter(
            "scaleout_stream_errors_total",
            "Ingress: streams that failed after their first event (an error event sent).",
        )

    @functools.cached_property
    def text_placements(self) -> Counter:
        return self._counter(
            "scaleout_text_placement_total",
            "Ingress: text requests by placement (inline, tier) and why: requested (by "
            "X-Text-Placement or the graph's text_placement), or text_placement auto's "
            "reason (short, shared-cpus, share, tokens-only).",
            ("placement", "reason"),
        )

    @functools.cached_property
    def abort_ids(self) -> Counter:
        return self._counter(
            "scaleout_abort_ids_total", "Control plane: request ids that aborts named."
        )

    @functools.cached_property
    def aborted_requests(self) -> Counter:
        return self._counter(
            "scaleout_aborted_requests_total",
            "Control plane: engine requests those aborts ended (an id unknown or "
            "finished ends none).",
        )

    @functools.cached_property
    def migrations(self) -> Counter:
        return self._counter(
            "scaleout_stream_migrations_total",
            "Streams moved to another Generate replica after theirs was lost or left; "
            "the deployment label names the caller that made the call again.",
        )


_configured = {"enabled": True}


def configure_metrics(enabled: bool) -> None:
    """Whether this process records (``GraphConfig.observability.metrics``): each
    replica sets it as it starts, before it records anything."""
    _configured["enabled"] = enabled
    graph_metrics.cache_clear()


@functools.cache
def graph_metrics() -> GraphMetrics:
    """This process's metrics (recording nothing outside a Serve replica, or where the
    graph's config turned them off)."""
    from ray import serve
    from ray.serve.exceptions import RayServeException

    if not _configured["enabled"]:
        return GraphMetrics(enabled=False)
    try:
        serve.get_replica_context()
    except RayServeException:
        return GraphMetrics(enabled=False)
    return GraphMetrics(enabled=True)


class Gaps:
    """Times the gaps between one stream's items: ``tick()`` at each."""

    __slots__ = ("_last", "_observe")

    def __init__(self) -> None:
        self._last = 0.0
        self._observe: Callable[[float], Any] | None = None

    def tick(self) -> None:
        now = time.perf_counter()
        if self._observe is None:
            self._observe = graph_metrics().inter_item_seconds.observe
        else:
            self._observe(now - self._last)
        self._last = now


class CpuPerToken:
    """Counts tokens as they are done and, at most every ``every_s``, adds them and the
    process's CPU time since the last time to the two counters, so their rates' ratio
    is the CPU per token over any range (Ray's agent reads them every 10 s anyway).
    ``tick`` adds what a burst left once its interval is over, with no token after it."""

    def __init__(
        self,
        every_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.process_time,
        metrics: GraphMetrics | None = None,
    ) -> None:
        self._every_s, self._clock, self._cpu_clock = every_s, clock, cpu_clock
        self._metrics = metrics
        self._cpu, self._flushed, self._tokens = cpu_clock(), clock(), 0

    def did(self, tokens: int) -> None:
        self._tokens += tokens
        self._add(self._clock())

    def tick(self) -> None:
        """Call now and then: tokens done since the last addition are added once their
        interval is over, though no more come (the last stream of a burst)."""
        if self._tokens > 0:
            self._add(self._clock())

    def _add(self, now: float) -> None:
        if now - self._flushed < self._every_s:
            return
        metrics = self._metrics or graph_metrics()
        cpu, self._cpu = self._cpu, self._cpu_clock()
        tokens, self._tokens, self._flushed = self._tokens, 0, now
        if self._cpu > cpu:  # a Ray counter takes only increments above 0
            metrics.derender_cpu_seconds.inc(self._cpu - cpu)
        if tokens > 0:
            metrics.derender_tokens.inc(tokens)
