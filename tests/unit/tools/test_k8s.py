"""k8s/: RayService manifests valid against KubeRay v1.7.0's CRDs and operator rules."""

from __future__ import annotations

import copy
import functools
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from bench.harness.kustomize import kustomize
from bench.harness.servers import REPO
from deployments.config.graph_config import GraphConfig
from tests.support.crd import KUBERAY, all_errors, schema_errors, to_json_schema
from tests.unit.config.test_configs import unknown_keys

OVERLAYS = sorted(p.name for p in (REPO / "k8s" / "overlays").iterdir())
TOPOLOGY_OVERLAYS = [name for name in OVERLAYS if name != "cpu"]
SAMPLES = sorted((KUBERAY / "samples").glob("*.yaml"))


def manifests() -> dict[str, dict[str, Any]]:
    return copy.deepcopy(_built())


@functools.cache
def _built() -> dict[str, dict[str, Any]]:
    """The RayService each of base and the overlays builds."""
    return {name: _objects(name)["RayService"] for name in ["base", *OVERLAYS]}


@functools.cache
def _objects(name: str) -> dict[str, dict[str, Any]]:
    """Every object ``name`` (base or an overlay) builds, by kind (one of each)."""
    folder = REPO / "k8s" / ("base" if name == "base" else f"overlays/{name}")
    docs = kustomize(folder)
    by_kind = {doc["kind"]: doc for doc in docs}
    assert len(by_kind) == len(docs), f"{name}: two objects of one kind"
    return by_kind


def test_kuberay_crds_and_samples_are_there() -> None:
    assert (KUBERAY / "crds").is_dir(), f"KubeRay CRDs not found at {KUBERAY}"
    assert len(SAMPLES) >= 10


@pytest.mark.parametrize("sample", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_official_samples_pass(sample: Path) -> None:
    for doc in yaml.safe_load_all(sample.read_text()):
        if doc and doc.get("kind") in ("RayService", "RayCluster"):
            assert all_errors(doc) == []


def test_samples_need_defaults_applied_first() -> None:
    """Self-check: without the API server's defaulting, official samples fail."""
    import jsonschema

    from tests.support.crd import crd_schema, drop_nulls

    failing = 0
    for sample in SAMPLES:
        for doc in yaml.safe_load_all(sample.read_text()):
            if doc and doc.get("kind") in ("RayService", "RayCluster"):
                schema = to_json_schema(copy.deepcopy(crd_schema(doc["kind"])))
                failing += any(jsonschema.Draft7Validator(schema).iter_errors(drop_nulls(doc)))
    assert failing > 0


def broken_variants() -> dict[str, Any]:
    base = manifests()["s"]

    def variant(change: Any) -> dict[str, Any]:
        doc = copy.deepcopy(base)
        change(doc)
        return doc

    cluster = lambda d: d["spec"]["rayClusterConfig"]  # noqa: E731
    return {
        "typo key": variant(lambda d: d["spec"].update(serveConfigV3="x")),
        "typo in worker group": variant(lambda d: cluster(d)["workerGroupSpecs"][0].update(
            minReplica=1)),
        "wrong type": variant(lambda d: cluster(d).update(enableInTreeAutoscaling="yes")),
        "serveConfigV2 as a mapping": variant(lambda d: d["spec"].update(
            serveConfigV2={"applications": []})),
        "missing head group": variant(lambda d: cluster(d).pop("headGroupSpec")),
        "replicas as a string": variant(lambda d: cluster(d)["workerGroupSpecs"][0].update(
            replicas="2")),
        "int-or-string as a list": variant(lambda d: cluster(d)["headGroupSpec"]["template"][
            "spec"]["containers"][0]["ports"][0].update(containerPort=[1])),
        "name too long": variant(lambda d: d["metadata"].update(name="x" * 48)),
        "name not a DNS label": variant(lambda d: d["metadata"].update(name="Scaleout_Serve")),
        "minReplicas above maxReplicas": variant(lambda d: cluster(d)["workerGroupSpecs"][0].update(
            minReplicas=5, maxReplicas=2)),
        "unknown upgrade strategy": variant(lambda d: d["spec"].update(
            upgradeStrategy={"type": "BlueGreen"})),
        "rayStartParams not strings": variant(lambda d: cluster(d)["headGroupSpec"][
            "rayStartParams"].update({"num-cpus": 0})),
    }  # fmt: skip


@pytest.mark.parametrize("what", list(broken_variants()))
def test_broken_variants_fail(what: str) -> None:
    assert all_errors(broken_variants()[what]), what


@pytest.mark.parametrize("name", ["base", *OVERLAYS])
def test_manifest_validates(name: str) -> None:
    assert all_errors(manifests()[name]) == []


def test_manifests_have_the_gpu_profile_shape() -> None:
    cluster = manifests()["base"]["spec"]["rayClusterConfig"]
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    assert cluster["enableInTreeAutoscaling"] is True and cluster["autoscalerOptions"]
    gpu, cpu = cluster["workerGroupSpecs"]
    resources = gpu["template"]["spec"]["containers"][0]["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"]
    assert "nvidia.com/gpu" not in cpu["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert cpu["minReplicas"] < cpu["maxReplicas"]
    # Nothing but Generate lands on a GPU node: it offers Ray only Generate's CPUs.
    gpu_args = yaml.safe_load((REPO / "configs" / "gpu.yaml").read_text())["applications"][0]
    assert float(gpu["rayStartParams"]["num-cpus"]) == gpu_args["args"]["generate"]["num_cpus"]


@pytest.mark.parametrize("name", ["base", *TOPOLOGY_OVERLAYS])
def test_serve_config_v2_is_a_valid_graph_config(name: str) -> None:
    text = manifests()[name]["spec"]["serveConfigV2"]
    assert isinstance(text, str)
    data = yaml.safe_load(text)
    schema = ServeDeploySchema.model_validate(data)
    assert unknown_keys(data, ServeDeploySchema) == []
    (app,) = schema.applications
    config = GraphConfig.from_args(app.args)
    assert config.num_gpus == 1
    if name != "base":
        local = yaml.safe_load((REPO / "configs" / f"{name.upper()}.yaml").read_text())
        args = local["applications"][0]["args"]
        assert config.tokens_only == args.get("tokens_only", False)
        assert config.text_placement == args.get("text_placement", "inline")
        assert config.tool_call_parser == args.get("tool_call_parser")


def test_the_cpu_overlay_carries_the_cluster_profile_and_its_node_groups() -> None:
    """What tests/cluster starts locally and deploys: the same placement rule as KubeRay's."""
    doc = manifests()["cpu"]
    data = yaml.safe_load(doc["spec"]["serveConfigV2"])
    assert data == yaml.safe_load((REPO / "configs" / "cluster.yaml").read_text())
    assert unknown_keys(data, ServeDeploySchema) == []
    config = GraphConfig.from_args(ServeDeploySchema.model_validate(data).applications[0].args)
    assert config.num_gpus == 0 and config.text_placement == "tier"
    cluster = doc["spec"]["rayClusterConfig"]
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    assert cluster["autoscalerOptions"]["version"] == "v2"
    groups = {g["groupName"]: g for g in cluster["workerGroupSpecs"]}
    engine = groups["engine"]
    # The engine nodes offer what Generate asks for, and no CPU beyond its own.
    assert {k: float(v) for k, v in engine["resources"].items()} == config.generate.resources
    assert float(engine["rayStartParams"]["num-cpus"]) == config.generate.num_cpus
    for group in groups.values():
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert "nvidia.com/gpu" not in limits
        assert group["minReplicas"] <= group["maxReplicas"]
    assert groups["cpu-text"]["maxReplicas"] > groups["cpu-text"]["minReplicas"]
    # A Derender replica fits a CPU node, and the largest Derender count needs more than one.
    cpu_node = float(groups["cpu-text"]["rayStartParams"]["num-cpus"])
    derender = config.derender
    assert derender.num_cpus is not None and derender.autoscaling is not None
    assert derender.num_cpus <= cpu_node < derender.num_cpus * derender.autoscaling.max_replicas


def test_k8s_is_generated_from_configs() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/render_k8s.py", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def test_kubectl_kustomize_agrees_where_kubectl_exists() -> None:
    """`kubectl kustomize` runs offline; where it is installed, it builds the same objects."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed on this machine")
    for name in OVERLAYS:
        out = subprocess.run(
            [kubectl, "kustomize", f"k8s/overlays/{name}"],
            cwd=REPO, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        built = list(yaml.safe_load_all(out))
        assert {doc["kind"]: doc for doc in built} == _objects(name)
        assert len(built) == len(_objects(name))


def test_schema_errors_name_the_field() -> None:
    doc = copy.deepcopy(manifests()["s"])
    doc["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] = "yes"
    assert any("enableInTreeAutoscaling" in e for e in schema_errors(doc))


def _pods(doc: dict[str, Any]) -> list[dict[str, Any]]:
    cluster = doc["spec"]["rayClusterConfig"]
    return [g["template"] for g in (cluster["headGroupSpec"], *cluster["workerGroupSpecs"])]


@pytest.mark.parametrize("name", ["base", *OVERLAYS])
def test_every_pod_runs_ray_token_auth_and_the_api_key_from_a_secret(name: str) -> None:
    doc = manifests()[name]
    # KubeRay v1.7 makes the token's secret and sets RAY_AUTH_MODE/RAY_AUTH_TOKEN on every pod.
    assert doc["spec"]["rayClusterConfig"]["authOptions"] == {"mode": "token"}
    assert all_errors(doc) == []
    for pod in _pods(doc):
        for container in pod["spec"]["containers"]:
            env = {e["name"]: e for e in container["env"]}
            ref = env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"]
            assert ref["name"] == "scaleout-serve-api-key" and not ref.get("optional"), ref
            assert "value" not in env["VLLM_API_KEY"]


def _reachable_from_anywhere(policy: dict[str, Any]) -> set[int | str]:
    """Ports a rule opens to every source (no ``from``), or None for all ports."""
    ports: set[int | str] = set()
    for rule in policy["spec"]["ingress"]:
        if rule.get("from"):
            continue
        assert rule.get("ports"), "a rule with neither from nor ports opens every port"
        ports |= {p["port"] for p in rule["ports"]}
    return ports


@pytest.mark.parametrize("name", ["base", *OVERLAYS])
def test_no_ray_port_but_serves_is_reachable_from_outside_the_graph(name: str) -> None:
    objects = _objects(name)
    policy, service = objects["NetworkPolicy"], objects["RayService"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    # The policy covers every pod of the cluster.
    for pod in _pods(service):
        assert selector.items() <= pod["metadata"]["labels"].items()
    assert _reachable_from_anywhere(policy) == {8000}
    for rule in policy["spec"]["ingress"]:
        for source in rule.get("from", []):
            labels = source["podSelector"]["matchLabels"]
            if "namespaceSelector" in source:  # another namespace: operator, Prometheus
                allowed = {"kuberay-operator": [8265], "prometheus": [8080]}
                assert labels.keys() == {"app.kubernetes.io/name"}, labels
                assert [p["port"] for p in rule["ports"]] == allowed[
                    labels["app.kubernetes.io/name"]
                ]
            else:  # the graph's own pods (Ray's nodes talk to each other on many ports)
                assert labels == selector
    head = service["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]
    declared = {p["containerPort"] for c in head["spec"]["containers"] for p in c["ports"]}
    assert declared == {6379, 8265, 8000}  # no Ray Client port


def test_the_policy_check_fails_for_a_port_opened_to_all() -> None:
    policy = copy.deepcopy(_objects("base")["NetworkPolicy"])
    policy["spec"]["ingress"].append({"ports": [{"port": 8265}]})
    assert _reachable_from_anywhere(policy) == {8000, 8265}


def test_prometheus_may_scrape_every_port_the_pod_monitors_name() -> None:
    """k8s/monitoring's PodMonitors against k8s/base's NetworkPolicy: each scraped port
    is open to all, or to the Prometheus Operator's pods."""
    policy = _objects("base")["NetworkPolicy"]
    ports = {"serve": 8000, "metrics": 8080}  # KubeRay's names for the head's ports
    monitors = yaml.safe_load_all((REPO / "k8s/monitoring/podmonitor.yaml").read_text())
    scraped = {ports[e["port"]] for m in monitors for e in m["spec"]["podMetricsEndpoints"]}
    assert scraped == {8000, 8080}
    prometheus = {
        p["port"]
        for rule in policy["spec"]["ingress"]
        for source in rule.get("from", [])
        if source["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
        for p in rule["ports"]
    }
    assert scraped <= _reachable_from_anywhere(policy) | prometheus
