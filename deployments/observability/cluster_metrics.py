"""The graph's own metrics read back from Ray's metrics agents, for its ``/metrics``.

Every replica records them through Ray (``metrics.py``); each node's metrics agent
exports what the processes there recorded, on the node's metrics export port, as
Prometheus text among Ray's own (hundreds of kilobytes). A scrape of the graph's
``/metrics`` reads every live node's agent, keeps the families named
``ray_scaleout_*`` of this application, and drops the labels Ray adds for its own
bookkeeping (worker id, session, version, OpenTelemetry scope), so that the series are
the ones a cluster scrape of the same agents holds, labelled by application,
deployment and replica.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import httpx
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

logger = logging.getLogger("ray.serve")

FAMILY_PREFIX = "ray_scaleout_"
# What Ray's agent adds to every series, which says nothing of the graph.
RAY_LABELS = frozenset(
    {"Component", "NodeAddress", "SessionName", "Version", "WorkerId", "otel_scope_name",
     "otel_scope_schema_url", "otel_scope_version"}
)  # fmt: skip
AGENT_TIMEOUT_S = 5.0


def agent_urls() -> list[str]:
    """The metrics endpoint of every live node's Ray metrics agent (a GCS call)."""
    import ray

    return [
        f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
        for node in ray.nodes()
        if node.get("Alive") and node.get("MetricsExportPort")
    ]


async def graph_families(application: str) -> list[Metric]:
    """This application's ``ray_scaleout_*`` families from every node's agent; an
    agent that does not answer is left out (logged), as a scrape target that is down,
    and none at all (the GCS unreachable) leaves ``/metrics`` with vLLM's alone."""
    try:
        urls = await asyncio.to_thread(agent_urls)
    except Exception as exc:
        logger.warning("no node list for the graph's metrics: %r", exc)
        return []
    async with httpx.AsyncClient(timeout=AGENT_TIMEOUT_S) as client:
        answers = await asyncio.gather(*(client.get(url) for url in urls), return_exceptions=True)
    texts = []
    for url, answer in zip(urls, answers, strict=True):
        if isinstance(answer, BaseException) or answer.status_code != 200:
            logger.warning("no metrics from Ray's agent at %s: %r", url, answer)
            continue
        texts.append(answer.text)
    return families_of(texts, application)


def families_of(texts: Iterable[str], application: str) -> list[Metric]:
    """The ``ray_scaleout_*`` families of ``application`` in agents' expositions,
    merged by name, without Ray's own labels."""
    wanted = f'application="{application}"'
    families: dict[str, Metric] = {}
    for text in texts:
        kept = [
            line
            for line in text.splitlines()
            if (line.startswith(FAMILY_PREFIX) and wanted in line)
            or line.startswith(("# HELP " + FAMILY_PREFIX, "# TYPE " + FAMILY_PREFIX))
        ]
        for family in text_string_to_metric_families("\n".join(kept) + "\n"):
            if not family.samples:
                continue
            merged = families.setdefault(
                family.name, Metric(family.name, family.documentation, family.type)
            )
            merged.samples += [
                sample._replace(
                    labels={k: v for k, v in sample.labels.items() if k not in RAY_LABELS}
                )
                for sample in family.samples
            ]
    return list(families.values())
