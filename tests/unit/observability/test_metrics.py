"""The graph's metrics: what a scrape of Ray's agents keeps, the CPU-per-token
counters, and nothing recorded outside a Serve replica."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from deployments.config.graph_config import REPO_ROOT as REPO
from deployments.observability import cluster_metrics
from deployments.observability.cluster_metrics import families_of
from deployments.observability.metrics import NOTHING, CpuPerToken, GraphMetrics, graph_metrics
from deployments.vllm_adapter.engine_metrics import exposition

RAY = (
    'Component="core_worker",NodeAddress="10.0.0.{node}",SessionName="session_x",'
    'Version="2.60.0",WorkerId="{worker}",otel_scope_name="ray",otel_scope_schema_url="",'
    'otel_scope_version=""'
)


def agent_text(node: int, app: str, replica: str, count: float) -> str:
    """A node agent's exposition as Ray 2.60 writes it: Ray's own families, and one
    histogram and one counter of the graph."""
    labels = RAY.format(node=node, worker=f"w{node}")
    ours = f'application="{app}",deployment="Render",replica="{replica}"'
    return f"""# HELP ray_tasks Ray's own.
# TYPE ray_tasks gauge
ray_tasks{{{labels},State="RUNNING"}} 3.0
# HELP ray_scaleout_unary_call_seconds A unary call.
# TYPE ray_scaleout_unary_call_seconds histogram
ray_scaleout_unary_call_seconds_bucket{{{labels},{ours},le="0.01",method="chat_text"}} {count}
ray_scaleout_unary_call_seconds_bucket{{{labels},{ours},le="+Inf",method="chat_text"}} {count}
ray_scaleout_unary_call_seconds_count{{{labels},{ours},method="chat_text"}} {count}
ray_scaleout_unary_call_seconds_sum{{{labels},{ours},method="chat_text"}} 0.5
# HELP ray_scaleout_refusals_total Refusals.
# TYPE ray_scaleout_refusals_total counter
ray_scaleout_refusals_total{{{labels},{ours},status="400"}} 2.0
"""


def test_the_graphs_families_of_one_application_from_every_node_without_rays_labels() -> None:
    texts = [
        agent_text(1, "default", "a", 4),
        agent_text(2, "default", "b", 6) + agent_text(2, "other", "c", 100),
    ]
    families = {f.name: f for f in families_of(texts, "default")}
    assert set(families) == {"ray_scaleout_unary_call_seconds", "ray_scaleout_refusals"}
    counts = {
        s.labels["replica"]: s.value
        for s in families["ray_scaleout_unary_call_seconds"].samples
        if s.name.endswith("_count")
    }
    assert counts == {"a": 4, "b": 6}  # the other application's replica is left out
    refusal = families["ray_scaleout_refusals"].samples[0]
    assert refusal.name == "ray_scaleout_refusals_total"
    assert refusal.labels == {
        "application": "default",
        "deployment": "Render",
        "replica": "a",
        "status": "400",
    }


def test_the_merged_exposition_reads_back_as_prometheus_text() -> None:
    text = exposition([], families_of([agent_text(1, "default", "a", 4)], "default"))
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["ray_scaleout_unary_call_seconds"].type == "histogram"
    assert families["ray_scaleout_refusals"].type == "counter"
    assert "WorkerId" not in text and "ray_tasks" not in text


class FakeCounter:
    def __init__(self) -> None:
        self.total = 0.0

    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        assert value > 0  # what Ray's counter takes
        self.total += value


class FakeMetrics(GraphMetrics):
    def __init__(self) -> None:
        super().__init__(enabled=False)
        self.tokens, self.cpu = FakeCounter(), FakeCounter()

    @property
    def derender_tokens(self) -> FakeCounter:
        return self.tokens

    @property
    def derender_cpu_seconds(self) -> FakeCounter:
        return self.cpu


def test_cpu_per_token_adds_cpu_and_tokens_at_most_every_interval() -> None:
    clock, cpu = [0.0], [10.0]
    metrics = FakeMetrics()
    counter = CpuPerToken(1.0, lambda: clock[0], lambda: cpu[0], metrics)
    for _ in range(5):  # within the first second: held
        clock[0] += 0.1
        cpu[0] += 0.01
        counter.did(3)
    assert (metrics.tokens.total, metrics.cpu.total) == (0, 0)
    clock[0] = 1.0
    cpu[0] = 10.2
    counter.did(1)
    assert metrics.tokens.total == 16
    assert abs(metrics.cpu.total - 0.2) < 1e-9
    clock[0] = 2.5  # an idle second: no tokens, no CPU, and no increment of 0
    counter.did(0)
    assert metrics.tokens.total == 16 and abs(metrics.cpu.total - 0.2) < 1e-9


def test_cpu_per_token_adds_a_bursts_last_tokens_on_a_tick() -> None:
    clock, cpu = [0.0], [10.0]
    metrics = FakeMetrics()
    counter = CpuPerToken(1.0, lambda: clock[0], lambda: cpu[0], metrics)
    clock[0], cpu[0] = 0.4, 10.1
    counter.did(6)  # the burst's last stream, within its interval: held
    counter.tick()
    assert metrics.tokens.total == 0
    clock[0] = 1.2  # no token since: the tick adds them
    counter.tick()
    assert metrics.tokens.total == 6 and abs(metrics.cpu.total - 0.1) < 1e-9
    clock[0] = 5.0  # nothing held: a tick adds nothing (no increment of 0 either)
    counter.tick()
    assert metrics.tokens.total == 6 and abs(metrics.cpu.total - 0.1) < 1e-9


def test_outside_a_serve_replica_nothing_is_recorded() -> None:
    metrics = graph_metrics()
    assert metrics.inter_item_seconds is NOTHING
    assert metrics.refusals is NOTHING


def test_the_podmonitor_samples_select_the_rayservices_pods_and_ports() -> None:
    monitors = {
        m["metadata"]["name"]: m["spec"]
        for m in yaml.safe_load_all((REPO / "k8s/monitoring/podmonitor.yaml").read_text())
    }
    service = yaml.safe_load((REPO / "k8s/base/rayservice.yaml").read_text())
    cluster = service["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]["template"]
    # KubeRay labels every pod with its node type; the template's own labels come along.
    labels = {**head["metadata"]["labels"], "ray.io/node-type": "head"}
    graph = monitors["scaleout-graph"]
    assert graph["selector"]["matchLabels"].items() <= labels.items()
    ports = {p["name"] for c in head["spec"]["containers"] for p in c.get("ports") or ()}
    assert [e["port"] for e in graph["podMetricsEndpoints"]] == ["serve"]
    assert "serve" in ports
    assert graph["podMetricsEndpoints"][0]["path"] == "/metrics"
    nodes = monitors["scaleout-ray-nodes"]["selector"]["matchLabels"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        assert nodes.items() <= group["template"]["metadata"]["labels"].items()


def test_without_a_node_list_metrics_has_no_graph_families(monkeypatch: Any) -> None:
    def unreachable() -> list[str]:
        raise ConnectionError("GCS down")

    monkeypatch.setattr(cluster_metrics, "agent_urls", unreachable)
    assert asyncio.run(cluster_metrics.graph_families("default")) == []


def test_ray_takes_every_metric_as_the_graph_declares_it() -> None:
    # Made with Ray's own classes (outside a replica: no Serve tags), so an argument Ray
    # refuses (a histogram bound ≤ 0, a reserved tag) fails here, not in a replica
    # on the request path.
    metrics = GraphMetrics(enabled=True)
    names = [n for n, v in vars(GraphMetrics).items() if isinstance(v, functools.cached_property)]
    assert len(names) >= 15
    for name in names:
        metric = getattr(metrics, name)
        assert metric is not NOTHING, name
        assert hasattr(metric, "observe") or hasattr(metric, "inc"), name
