"""Every way of starting the graph runs it with the same Serve switches."""

from __future__ import annotations

import re

import yaml

from bench.harness.servers import REPO
from deployments.config.serve_env import SERVE_ENV

EXPORT = re.compile(r"^export (RAY_\w+) \?= (\S+)$", re.MULTILINE)


def test_make_run_exports_the_serve_switches() -> None:
    exported = dict(EXPORT.findall((REPO / "Makefile").read_text()))
    assert exported == SERVE_ENV


def test_every_kuberay_pod_sets_the_serve_switches() -> None:
    service = yaml.safe_load((REPO / "k8s/base/rayservice.yaml").read_text())
    cluster = service["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for pod in pods:
        for container in pod["template"]["spec"]["containers"]:
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert {k: env.get(k) for k in SERVE_ENV} == SERVE_ENV, container["name"]
