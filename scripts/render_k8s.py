"""Generate k8s/ (RayService base + one Kustomize overlay per topology) from configs/.

    python scripts/render_k8s.py          # (re)write k8s/base and k8s/overlays
    python scripts/render_k8s.py --check  # fail if k8s/ differs from what configs/ give

``serveConfigV2`` is always rendered from ``configs/gpu.yaml`` (the GPU
profile); each overlay swaps in the topology switches of ``configs/<T>.yaml``
(tokens_only, text_placement, parsers). A test runs ``--check``, so the
manifests cannot drift from the configs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from deployments.ray_env import SERVE_ENV
from deployments.topologies import TOPOLOGIES, app_config, gpu_topology_app

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"
K8S = REPO / "k8s"
IMAGE = "scaleout-serve:0.1.0-gpu"
NAME = "scaleout-serve"
MODEL_CACHE = {"name": "model-cache", "mountPath": "/models"}
ENV = [
    {"name": "HF_HOME", "value": "/models/hf-cache"},
    {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token", "optional": True}},
    },
    # Serve reads these as each Ray process starts: set on every pod.
    *({"name": name, "value": value} for name, value in SERVE_ENV.items()),
]


def serve_config_v2(app: dict[str, Any]) -> str:
    return yaml.safe_dump({"applications": [app]}, sort_keys=False)


def container(name: str, resources: dict[str, Any], ports: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "name": name,
        "image": IMAGE,
        "env": ENV,
        "resources": resources,
        "ports": ports,
        "volumeMounts": [MODEL_CACHE],
    }


def pod(name: str, resources: dict[str, Any], ports: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "spec": {
            "containers": [container(name, resources, ports)],
            "volumes": [
                {"name": "model-cache", "persistentVolumeClaim": {"claimName": "model-cache"}}
            ],
        }
    }


def rayservice() -> dict[str, Any]:
    head_ports = [
        {"containerPort": 6379, "name": "gcs-server"},
        {"containerPort": 8265, "name": "dashboard"},
        {"containerPort": 10001, "name": "client"},
        {"containerPort": 8000, "name": "serve"},
    ]
    cpu = {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"cpu": "4", "memory": "16Gi"}}
    gpu = {
        "requests": {"cpu": "8", "memory": "48Gi", "nvidia.com/gpu": "1"},
        "limits": {"cpu": "8", "memory": "48Gi", "nvidia.com/gpu": "1"},
    }
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": NAME, "labels": {"app.kubernetes.io/name": NAME}},
        "spec": {
            "upgradeStrategy": {"type": "NewCluster"},
            "serveConfigV2": serve_config_v2(app_config(CONFIGS / "gpu.yaml")),
            "rayClusterConfig": {
                "rayVersion": "2.60.0",
                "enableInTreeAutoscaling": True,
                "autoscalerOptions": {
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
                        head_ports,
                    ),
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "gpu-generate",
                        "replicas": 1,
                        "minReplicas": 1,
                        "maxReplicas": 4,
                        "rayStartParams": {},
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


def overlay(topology: str) -> dict[str, str]:
    """Files of k8s/overlays/<topology>: a name suffix and a serveConfigV2 patch."""
    patch = [
        {
            "op": "replace",
            "path": "/spec/serveConfigV2",
            "value": serve_config_v2(gpu_topology_app(CONFIGS, topology)),
        }
    ]
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["../../base"],
        "nameSuffix": f"-{topology.lower()}",
        "patches": [{"path": "serve-config.yaml", "target": {"kind": "RayService", "name": NAME}}],
    }
    return {
        "kustomization.yaml": yaml.safe_dump(kustomization, sort_keys=False),
        "serve-config.yaml": yaml.safe_dump(patch, sort_keys=False),
    }


def files() -> dict[Path, str]:
    header = "# Generated by scripts/render_k8s.py from configs/; do not edit.\n"
    out = {
        K8S / "base" / "rayservice.yaml": header + yaml.safe_dump(rayservice(), sort_keys=False),
        K8S / "base" / "kustomization.yaml": header
        + yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": ["rayservice.yaml"],
            },
            sort_keys=False,
        ),
    }
    for topology in TOPOLOGIES:
        for name, text in overlay(topology).items():
            out[K8S / "overlays" / topology.lower() / name] = header + text
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
