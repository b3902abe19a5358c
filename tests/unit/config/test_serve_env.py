"""Every way of starting the graph runs it with the same Serve switches."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from bench.harness.kustomize import kustomize
from bench.harness.servers import REPO
from deployments.config.haproxy_launcher import BINARY_SWITCH
from deployments.config.serve_env import (
    SERVE_ENV,
    missing_switches,
    set_missing_switches,
    switch_is_set,
    switches_warning,
)

EXPORT = re.compile(r"^export ((?:RAY_|REPORTER_|METRICS_)\w+) \?= (.+)$", re.MULTILINE)


def test_make_run_exports_the_serve_switches() -> None:
    exported = dict(EXPORT.findall((REPO / "Makefile").read_text()))
    assert set(exported) == set(SERVE_ENV)
    assert missing_switches(exported) == {}
    # The launcher in the venv `make` installs, whichever folder VENV names.
    assert exported[BINARY_SWITCH] == "$(abspath $(VENV))/bin/scaleout-haproxy"


def test_every_kuberay_pod_sets_the_serve_switches() -> None:
    folders = [REPO / "k8s/base", *sorted((REPO / "k8s/overlays").iterdir())]
    for folder in folders:
        (service,) = [d for d in kustomize(folder) if d["kind"] == "RayService"]
        cluster = service["spec"]["rayClusterConfig"]
        for pod in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
            for container in pod["template"]["spec"]["containers"]:
                env = {e["name"]: e.get("value") for e in container["env"]}
                assert missing_switches(env) == {}, (folder.name, container["name"])
                assert env[BINARY_SWITCH] == "/usr/local/bin/scaleout-haproxy"


def test_both_images_put_the_launcher_where_the_pods_name_it() -> None:
    for dockerfile in ("k8s/Dockerfile", "k8s/Dockerfile.cpu"):
        text = (REPO / dockerfile).read_text()
        assert "ln -s" in text and " /usr/local/bin/scaleout-haproxy" in text, dockerfile


def test_a_path_switch_is_set_by_any_path_to_its_file() -> None:
    env = {**SERVE_ENV, BINARY_SWITCH: "/opt/venv/bin/scaleout-haproxy"}
    assert missing_switches(env) == {}
    env[BINARY_SWITCH] = "/usr/sbin/haproxy"
    assert missing_switches(env) == {BINARY_SWITCH: "/usr/sbin/haproxy"}
    assert not switch_is_set(BINARY_SWITCH, None)


def test_the_launcher_switch_names_this_interpreters_console_script() -> None:
    # pip installed it with the project (pyproject.toml's [project.scripts]).
    path = Path(SERVE_ENV[BINARY_SWITCH])
    assert path == Path(sys.executable).parent / "scaleout-haproxy"
    assert path.is_file() and os.access(path, os.X_OK)


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


def test_a_path_switch_whose_file_is_missing_is_left_unset(monkeypatch: Any) -> None:
    import deployments.config.serve_env as serve_env

    monkeypatch.setitem(serve_env.SERVE_ENV, BINARY_SWITCH, "/nonexistent/bin/scaleout-haproxy")
    env: dict[str, str] = {}
    added = set_missing_switches(env)
    assert BINARY_SWITCH not in env and BINARY_SWITCH not in added
    assert missing_switches(env) == {BINARY_SWITCH: None}  # the control plane warns of it
