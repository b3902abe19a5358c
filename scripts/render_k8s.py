"""Generate k8s/ (RayService base + one Kustomize overlay per topology) from configs/.

    python scripts/render_k8s.py          # (re)write k8s/base and k8s/overlays
    python scripts/render_k8s.py --check  # fail if k8s/ differs from what configs/ give

The base's ``serveConfigV2`` is rendered from ``configs/gpu.yaml`` (the GPU
profile); each topology overlay swaps in the switches of ``configs/<T>.yaml``
(tokens_only, text_placement, parsers). The ``cpu`` overlay is the CPU cluster
profile, ``configs/cluster.yaml``, with its node groups: the shape that
``tests/cluster`` starts as a local Ray cluster and deploys this very
``serveConfigV2`` to. A test runs ``--check``, so the manifests cannot drift
from the configs.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import yaml

from deployments.config.haproxy_launcher import BINARY_SWITCH, LAUNCHER_NAME
from deployments.config.serve_env import SERVE_ENV
from deployments.config.topologies import TOPOLOGIES, app_config, gpu_topology_app, serve_config

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"
K8S = REPO / "k8s"
IMAGE = "scaleout-serve:0.1.0-gpu"
CPU_IMAGE = "scaleout-serve:0.1.0-cpu"
# The node group whose Ray nodes offer what Generate asks for besides CPUs.
ENGINE_GROUP = "engine"
NAME = "scaleout-serve"
API_KEY_SECRET = f"{NAME}-api-key"
# Every pod of the graph carries it; the NetworkPolicy lets only these reach each other.
POD_LABELS = {"app.kubernetes.io/name": NAME}
SERVE_PORT = 8000
# The KubeRay operator deploys serveConfigV2 and reads Serve's status through the head's
# dashboard, with the cluster's token; nothing else outside the cluster needs it.
OPERATOR_LABELS = {"app.kubernetes.io/name": "kuberay-operator"}
DASHBOARD_PORT = 8265
# k8s/monitoring's PodMonitors scrape Ray's metrics agent on every pod (KubeRay's
# `metrics` port) from the Prometheus Operator's pods, in whatever namespace they run.
METRICS_PORT = 8080
PROMETHEUS_LABELS = {"app.kubernetes.io/name": "prometheus"}
MODEL_CACHE = {"name": "model-cache", "mountPath": "/models"}
# Where both images put the HAProxy launcher (k8s/Dockerfile, k8s/Dockerfile.cpu).
IMAGE_LAUNCHER = f"/usr/local/bin/{LAUNCHER_NAME}"
# The Serve switches as the images install them (a path switch names the image's path).
POD_SWITCHES = {**SERVE_ENV, BINARY_SWITCH: IMAGE_LAUNCHER}
ENV = [
    {"name": "HF_HOME", "value": "/models/hf-cache"},
    {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token", "optional": True}},
    },
    # The graph's API key (GraphConfig reads VLLM_API_KEY when no api_key is given):
    # required, so no pod serves an open API by mistake.
    {
        "name": "VLLM_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": API_KEY_SECRET, "key": "api-key"}},
    },
    # Serve reads these as each Ray process starts: set on every pod.
    *({"name": name, "value": value} for name, value in POD_SWITCHES.items()),
]


def serve_config_v2(app: dict[str, Any], **options: Any) -> str:
    return yaml.safe_dump({**options, "applications": [app]}, sort_keys=False)


def container(
    name: str, resources: dict[str, Any], ports: list[dict[str, Any]], image: str = IMAGE
) -> dict[str, Any]:
    return {
        "name": name,
        "image": image,
        "env": copy.deepcopy(ENV),  # a copy each: no YAML anchors in the output
        "resources": resources,
        "ports": ports,
        "volumeMounts": [dict(MODEL_CACHE)],
    }


def pod(
    name: str, resources: dict[str, Any], ports: list[dict[str, Any]], image: str = IMAGE
) -> dict[str, Any]:
    return {
        "metadata": {"labels": dict(POD_LABELS)},
        "spec": {
            "containers": [container(name, resources, ports, image)],
            "volumes": [
                {"name": "model-cache", "persistentVolumeClaim": {"claimName": "model-cache"}}
            ],
        },
    }


# No Ray Client port (10001): nothing here uses Ray Client. GCS is for the cluster's own
# pods, the dashboard for them and the operator (networkpolicy.yaml).
HEAD_PORTS = [
    {"containerPort": 6379, "name": "gcs-server"},
    {"containerPort": DASHBOARD_PORT, "name": "dashboard"},
    {"containerPort": SERVE_PORT, "name": "serve"},
]


def pod_resources(cpu: str, memory: str, **extra: str) -> dict[str, Any]:
    amounts = {"cpu": cpu, "memory": memory, **extra}
    return {"requests": amounts, "limits": dict(amounts)}


def generate_cpus(config: Path) -> str:
    """Logical CPUs an engine node offers Ray: what Generate asks for (0 in the shipped
    profiles), so that no other replica lands on the engine's host, however the
    scheduler orders them: its cores are the engine's, as the head's are Ray's."""
    return f"{app_config(config)['args']['generate']['num_cpus']:g}"


def rayservice() -> dict[str, Any]:
    cpu = pod_resources("4", "16Gi")
    gpu = pod_resources("8", "48Gi", **{"nvidia.com/gpu": "1"})
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": NAME, "labels": {"app.kubernetes.io/name": NAME}},
        "spec": {
            "upgradeStrategy": {"type": "NewCluster"},
            "serveConfigV2": serve_config_v2(app_config(CONFIGS / "gpu.yaml")),
            "rayClusterConfig": {
                "rayVersion": "2.60.0",
                # Ray token auth on every pod: KubeRay makes the secret and sets
                # RAY_AUTH_MODE and RAY_AUTH_TOKEN. Without it any pod that reaches
                # the dashboard or GCS can run code on the cluster (a Ray job), and
                # Serve's replica-to-replica gRPC takes calls that skip the Ingress.
                "authOptions": {"mode": "token"},
                "enableInTreeAutoscaling": True,
                "autoscalerOptions": {
                    "version": "v2",
                    "upscalingMode": "Default",
                    "idleTimeoutSeconds": 120,
                    "resources": {
                        "requests": {"cpu": "500m", "memory": "512Mi"},
                        "limits": {"cpu": "500m", "memory": "512Mi"},
                    },
                },
                "headGroupSpec": {
                    # No Serve replicas on the head: it keeps GCS and the controller.
                    "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
                    "template": pod(
                        "ray-head",
                        {
                            "requests": {"cpu": "2", "memory": "8Gi"},
                            "limits": {"cpu": "2", "memory": "8Gi"},
                        },
                        HEAD_PORTS,
                    ),
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "gpu-generate",
                        "replicas": 1,
                        "minReplicas": 1,
                        "maxReplicas": 4,
                        "rayStartParams": {"num-cpus": generate_cpus(CONFIGS / "gpu.yaml")},
                        "template": pod("ray-worker", gpu, []),
                    },
                    {
                        "groupName": "cpu-text",
                        "replicas": 1,
                        "minReplicas": 1,
                        "maxReplicas": 8,
                        "rayStartParams": {},
                        "template": pod("ray-worker", cpu, []),
                    },
                ],
            },
        },
    }


def network_policy() -> dict[str, Any]:
    """Into the graph's pods: the Serve port from anywhere; the dashboard from the
    KubeRay operator; Ray's metrics port from Prometheus (k8s/monitoring); everything
    from the graph's own pods (Ray's GCS, raylets, object manager and Serve's gRPC
    between nodes); nothing else."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": NAME, "labels": {"app.kubernetes.io/name": NAME}},
        "spec": {
            "podSelector": {"matchLabels": dict(POD_LABELS)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"ports": [{"port": SERVE_PORT, "protocol": "TCP"}]},
                {
                    "from": [
                        {
                            "namespaceSelector": {},
                            "podSelector": {"matchLabels": dict(OPERATOR_LABELS)},
                        }
                    ],
                    "ports": [{"port": DASHBOARD_PORT, "protocol": "TCP"}],
                },
                {
                    "from": [
                        {
                            "namespaceSelector": {},
                            "podSelector": {"matchLabels": dict(PROMETHEUS_LABELS)},
                        }
                    ],
                    "ports": [{"port": METRICS_PORT, "protocol": "TCP"}],
                },
                {"from": [{"podSelector": {"matchLabels": dict(POD_LABELS)}}]},
            ],
        },
    }


def overlay(topology: str) -> dict[str, str]:
    """Files of k8s/overlays/<topology>: a name suffix and a serveConfigV2 patch."""
    patch = [
        {
            "op": "replace",
            "path": "/spec/serveConfigV2",
            "value": serve_config_v2(gpu_topology_app(CONFIGS, topology)),
        }
    ]
    return _overlay_files(topology.lower(), patch)


def _overlay_files(suffix: str, patch: list[dict[str, Any]]) -> dict[str, str]:
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["../../base"],
        "nameSuffix": f"-{suffix}",
        "patches": [{"path": "serve-config.yaml", "target": {"kind": "RayService", "name": NAME}}],
    }
    return {
        "kustomization.yaml": yaml.safe_dump(kustomization, sort_keys=False),
        "serve-config.yaml": yaml.safe_dump(patch, sort_keys=False),
    }


def cpu_overlay() -> dict[str, str]:
    """k8s/overlays/cpu: the CPU cluster profile and its node groups (no GPU)."""
    cluster = serve_config(CONFIGS / "cluster.yaml")
    serve_v2 = serve_config_v2(
        cluster["applications"][0],
        proxy_location=cluster["proxy_location"],
        http_options=cluster["http_options"],
    )
    engine = app_config(CONFIGS / "cluster.yaml")["args"]["generate"]
    groups = [
        {
            "groupName": ENGINE_GROUP,
            "replicas": 1,
            "minReplicas": 1,
            "maxReplicas": 1,
            "rayStartParams": {"num-cpus": generate_cpus(CONFIGS / "cluster.yaml")},
            # Ray resources of every node of the group: what Generate's `resources` name.
            "resources": {name: f"{amount:g}" for name, amount in engine["resources"].items()},
            "template": pod("ray-worker", pod_resources("2", "8Gi"), [], CPU_IMAGE),
        },
        {
            "groupName": "cpu-text",
            "replicas": 1,
            "minReplicas": 1,
            "maxReplicas": 3,
            "rayStartParams": {"num-cpus": "2"},
            "template": pod("ray-worker", pod_resources("2", "6Gi"), [], CPU_IMAGE),
        },
    ]
    head = pod("ray-head", pod_resources("2", "8Gi"), HEAD_PORTS, CPU_IMAGE)
    cluster_config = "/spec/rayClusterConfig"
    patch = [
        {"op": "replace", "path": "/spec/serveConfigV2", "value": serve_v2},
        {"op": "replace", "path": f"{cluster_config}/headGroupSpec/template", "value": head},
        {"op": "replace", "path": f"{cluster_config}/workerGroupSpecs", "value": groups},
        {
            "op": "replace",
            "path": f"{cluster_config}/autoscalerOptions/idleTimeoutSeconds",
            "value": 30,
        },
    ]
    return _overlay_files("cpu", patch)


def files() -> dict[Path, str]:
    header = "# Generated by scripts/render_k8s.py from configs/; do not edit.\n"
    out = {
        K8S / "base" / "rayservice.yaml": header + yaml.safe_dump(rayservice(), sort_keys=False),
        K8S / "base" / "networkpolicy.yaml": header
        + yaml.safe_dump(network_policy(), sort_keys=False),
        K8S / "base" / "kustomization.yaml": header
        + yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": ["rayservice.yaml", "networkpolicy.yaml"],
            },
            sort_keys=False,
        ),
    }
    overlays = {topology.lower(): overlay(topology) for topology in TOPOLOGIES}
    overlays["cpu"] = cpu_overlay()
    for folder, texts in overlays.items():
        for name, text in texts.items():
            out[K8S / "overlays" / folder / name] = header + text
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    stale = []
    for path, text in files().items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path.relative_to(REPO)))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        sys.exit(f"k8s/ is stale against configs/ (run scripts/render_k8s.py): {stale}")


if __name__ == "__main__":
    main()
