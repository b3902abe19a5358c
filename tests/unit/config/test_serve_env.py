"""Every way of starting the graph runs it with the same Serve switches."""

from __future__ import annotations

import re

import yaml

from bench.harness.servers import REPO
from deployments.config.serve_env import (
    SERVE_ENV,
    missing_switches,
    set_missing_switches,
    switches_warning,
)

EXPORT = re.compile(r"^export ((?:RAY_|REPORTER_|METRICS_)\w+) \?= (\S+)$", re.MULTILINE)


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


def test_missing_switches_names_those_unset_or_set_otherwise() -> None:
    env = {**SERVE_ENV, "RAY_SERVE_LOG_TO_STDERR": "0"}
    del env["RAY_SERVE_THROUGHPUT_OPTIMIZED"]
    assert missing_switches(env) == {
        "RAY_SERVE_LOG_TO_STDERR": "0",
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": None,
    }
    assert missing_switches(SERVE_ENV) == {}


def test_set_missing_switches_keeps_what_the_user_set() -> None:
    env = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "0", "PATH": "/bin"}
    added = set_missing_switches(env)
    assert env == {**SERVE_ENV, "RAY_SERVE_THROUGHPUT_OPTIMIZED": "0", "PATH": "/bin"}
    assert set(added) == set(SERVE_ENV) - {"RAY_SERVE_THROUGHPUT_OPTIMIZED"}


def test_the_warning_names_each_missing_switch_with_its_value_there() -> None:
    text = switches_warning(
        {"RAY_SERVE_THROUGHPUT_OPTIMIZED": None, "RAY_SERVE_LOG_TO_STDERR": "0"}
    )
    assert "RAY_SERVE_THROUGHPUT_OPTIMIZED=1 (here: None)" in text
    assert "RAY_SERVE_LOG_TO_STDERR=1 (here: 0)" in text
    assert "RAY_SERVE_ENABLE_HA_PROXY" not in text
