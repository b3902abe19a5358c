"""Our k8s overlays built as ``kubectl kustomize`` builds them, offline and in Python.

Enough of Kustomize for what ``scripts/render_k8s.py`` writes: resources,
``nameSuffix`` and JSON 6902 ``replace`` patches. A unit test checks that
``kubectl kustomize`` builds the same objects where it is installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from bench.harness.servers import REPO

K8S = REPO / "k8s"


def kustomize(folder: Path) -> list[dict[str, Any]]:
    spec = yaml.safe_load((folder / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for resource in spec["resources"]:
        path = folder / resource
        docs += kustomize(path) if path.is_dir() else list(yaml.safe_load_all(path.read_text()))
    for patch in spec.get("patches", []):
        ops = yaml.safe_load((folder / patch["path"]).read_text())
        for doc in docs:
            if doc["kind"] == patch["target"]["kind"]:
                for op in ops:
                    if op["op"] != "replace":
                        raise ValueError(f"{folder}: only replace patches are supported: {op}")
                    *parents, leaf = op["path"].strip("/").split("/")
                    node = doc
                    for part in parents:
                        node = node[part]
                    node[leaf] = op["value"]
    for doc in docs:
        doc["metadata"]["name"] += spec.get("nameSuffix", "")
    return docs


def overlay(name: str, kind: str = "RayService") -> dict[str, Any]:
    """The one object of ``kind`` that ``k8s/overlays/<name>`` builds."""
    (doc,) = (d for d in kustomize(K8S / "overlays" / name) if d["kind"] == kind)
    return doc


def with_derender_scaling(rayservice: dict[str, Any], options: dict[str, float]) -> dict[str, Any]:
    """The manifest with ``options`` over its Derender autoscaling, in every application."""
    config = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    for app in config["applications"]:
        autoscaling = app["args"]["derender"]["autoscaling"]
        autoscaling.update(options)
    spec = {**rayservice["spec"], "serveConfigV2": yaml.safe_dump(config)}
    return {**rayservice, "spec": spec}


# Every node of a local cluster runs on this one host and shares its cores, so a
# Derender replica cannot use the core it reserves on a CPU node (its num_cpus, the
# cores the overlay's CPU policy gives it): its CPU signal here is measured against
# what one can use on this host beside the engine and the other tiers.
SHARED_HOST_DERENDER_CORES = 0.1


def on_shared_host(rayservice: dict[str, Any]) -> dict[str, Any]:
    """The overlay's RayService as a local cluster on one host runs it: its Derender's
    CPU autoscaling against ``SHARED_HOST_DERENDER_CORES`` per replica."""
    return with_derender_scaling(rayservice, {"cores_per_replica": SHARED_HOST_DERENDER_CORES})
