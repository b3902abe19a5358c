"""A multi-node Ray cluster on this machine, shaped like a RayService's node groups,
with the Ray autoscaler (v2, as KubeRay runs it) adding and removing worker nodes.

Ray's own pieces: ``ray start --head --autoscaling-config`` with the autoscaler's
fake multi-node provider (``FakeMultiNodeProvider``), the provider that
``ray.cluster_utils.AutoscalingCluster`` and Ray's autoscaler tests use. Each
worker node it launches is a real raylet with its own resources and labels
(told apart by those resources, ``ClusterShape.group_of``, ``cluster_shape.py``).

Why not ``AutoscalingCluster`` itself (Ray 2.60): its config template
(``fake_multi_node/example.yaml``, which provider type ``fake_multinode`` also
reads its defaults from) is not in the wheel; it runs ``ray stop
--force``, which stops every Ray instance of the user on the machine, at start
and at stop; and it fixes the GCS port at 6379. This cluster takes free ports
and a temp dir of its own, and stops exactly the processes that use that dir
and their children.

Token authentication is on for every process (``RAY_AUTH_MODE=token``): a Ray
2.60 cluster started by ``ray start`` needs it on every node, and clients need
it too (``client_env``). The token is this test session's own, passed as
``RAY_AUTH_TOKEN``: ``ray start`` does not make one, and the user's
``~/.ray/auth_token`` is neither needed nor touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from bench.harness.cluster_shape import FAKE_HEAD_NODE_ID, HEAD_GROUP, ClusterShape
from bench.harness.servers import PRISTINE_ENV, REPO, VENV_BIN, free_port, graph_env

# One token for every cluster this process starts and every client it runs.
AUTH_TOKEN = secrets.token_hex(32)


def client_env() -> dict[str, str]:
    """What a client process (serve CLI, state API) needs to reach the cluster."""
    return {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": AUTH_TOKEN,
        "RAY_USAGE_STATS_ENABLED": "0",
    }


@dataclass
class LocalCluster:
    shape: ClusterShape
    temp_dir: Path
    gcs_port: int
    dashboard_port: int
    log_path: Path
    ray_settings: dict[str, str] = field(default_factory=dict)
    """Ray system settings (``RAY_<name>``) the head, and so every node, starts with."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def env(self) -> dict[str, str]:
        path = f"{VENV_BIN}:{PRISTINE_ENV.get('PATH', '')}"
        return {**PRISTINE_ENV, "PATH": path, **client_env()}

    def start(self, timeout_s: float = 180) -> None:
        config = self.temp_dir / "autoscaling.yaml"
        config.write_text(json.dumps(self.shape.autoscaling_config(self.address)))
        env = {
            **self.env(),
            **graph_env(),  # Serve's switches, read as each Ray process starts
            "RAY_FAKE_CLUSTER": "1",
            "RAY_enable_autoscaler_v2": "1",
            "RAY_CLOUD_INSTANCE_ID": FAKE_HEAD_NODE_ID,
            "RAY_OVERRIDE_NODE_ID_FOR_TESTING": FAKE_HEAD_NODE_ID,
            "AUTOSCALER_UPDATE_INTERVAL_S": "1",
            **self.ray_settings,
        }
        argv = [
            str(VENV_BIN / "ray"),
            "start",
            "--head",
            "--node-ip-address=127.0.0.1",
            f"--port={self.gcs_port}",
            f"--num-cpus={self.shape.head_cpus:g}",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={self.dashboard_port}",
            f"--ray-client-server-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--temp-dir={self.temp_dir}",
            f"--autoscaling-config={config}",
            "--disable-usage-stats",
        ]
        with self.log_path.open("ab") as log:
            subprocess.run(
                argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, check=True
            )
        self.wait_nodes({g.name: g.min_nodes for g in self.shape.groups}, timeout_s)

    def nodes(self) -> list[dict[str, Any]]:
        """Alive nodes from Ray's state API: node_id, group, is_head, resources."""
        from ray.util.state import list_nodes

        # Filtered server-side, Ray 2.60 counts the dead nodes as missing output and raises.
        nodes = list_nodes(address=self.address, limit=1000, raise_on_missing_output=False)
        alive = [n for n in nodes if n.state == "ALIVE"]
        return [
            {
                "node_id": n.node_id,
                "group": HEAD_GROUP if n.is_head_node else self.shape.group_of(n.resources_total),
                "is_head": n.is_head_node,
                "resources": n.resources_total,
            }
            for n in alive
        ]

    def serve_applications(self) -> dict[str, Any]:
        """Serve's view of its applications as the dashboard's REST API gives it (what
        ``serve status`` reads): each deployment's config as Serve runs it."""
        reply = httpx.get(
            f"{self.dashboard_url}/api/serve/applications/",
            headers={"Authorization": f"Bearer {AUTH_TOKEN}"},
            timeout=30,
        )
        reply.raise_for_status()
        applications: dict[str, Any] = reply.json()["applications"]
        return applications

    def replicas(self) -> list[dict[str, Any]]:
        """Alive Serve replicas: app, deployment, replica id, node_id, pid."""
        from ray.util.state import list_actors

        actors = list_actors(
            address=self.address,
            filters=[("state", "=", "ALIVE")],
            limit=10000,
            raise_on_missing_output=False,
        )
        out = []
        for actor in actors:
            # Serve names a replica's actor SERVE_REPLICA::<app>#<deployment>#<replica id>.
            name = actor.name or ""
            if not name.startswith("SERVE_REPLICA::"):
                continue
            app, deployment, replica = name.removeprefix("SERVE_REPLICA::").split("#")
            out.append(
                {
                    "app": app,
                    "deployment": deployment,
                    "replica": replica,
                    "node_id": actor.node_id,
                    "pid": actor.pid,
                }
            )
        return out

    def controller(self) -> dict[str, Any]:
        """The Serve controller's actor: node_id and pid."""
        from ray.util.state import list_actors

        (actor,) = list_actors(
            address=self.address,
            filters=[("state", "=", "ALIVE"), ("class_name", "=", "ServeController")],
            raise_on_missing_output=False,
        )
        return {"node_id": actor.node_id, "pid": actor.pid}

    def groups(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.nodes():
            counts[node["group"]] = counts.get(node["group"], 0) + 1
        return counts

    def wait_nodes(self, at_least: dict[str, int], timeout_s: float) -> dict[str, int]:
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(Exception):  # the GCS may still be starting
                counts = self.groups()
                if all(counts.get(g, 0) >= n for g, n in at_least.items()):
                    return counts
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"nodes {at_least} not up after {timeout_s}s:\n{self.log_tail()}"
                )
            time.sleep(1)

    def deploy(self, serve_config: dict[str, Any]) -> None:
        """``serve deploy`` through the head's dashboard (Serve's REST API), as KubeRay does."""
        path = self.temp_dir / "serve-config.yaml"
        path.write_text(yaml.safe_dump(serve_config, sort_keys=False))
        with self.log_path.open("ab") as log:
            subprocess.run(
                [str(VENV_BIN / "serve"), "deploy", str(path), "-a", self.dashboard_url],
                cwd=REPO,
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                check=True,
                timeout=120,
            )

    def processes(self) -> list[psutil.Process]:
        """Every process of this cluster: those that name its temp dir, and their children
        (workers rename themselves, and vLLM's engine is a replica's child)."""
        marker = str(self.temp_dir)
        # The head's Ray client server names the GCS's address, not the temp dir, and
        # outlives the ``ray start`` that began it.
        roots = []
        for proc in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                cmdline = proc.info["cmdline"] or []
                if any(marker in arg for arg in cmdline) or (
                    "ray.util.client.server" in cmdline
                    and any(arg.startswith("--address=") and arg.endswith(f":{self.gcs_port}")
                            for arg in cmdline)
                ):  # fmt: skip
                    roots.append(proc)
        seen = {p.pid: p for p in roots}
        for root in roots:
            with contextlib.suppress(psutil.Error):
                for child in root.children(recursive=True):
                    seen.setdefault(child.pid, child)
        return list(seen.values())

    def raylet(self, node_id: str) -> psutil.Process:
        """The raylet process of one node."""
        for proc in self.processes():
            with contextlib.suppress(psutil.Error):
                cmdline = proc.cmdline()
                if cmdline and cmdline[0].endswith("raylet") and f"--node_id={node_id}" in cmdline:
                    return proc
        raise LookupError(f"no raylet for node {node_id}")

    def log_tail(self, lines: int = 40) -> str:
        text = (
            self.log_path.read_text(errors="replace").splitlines() if self.log_path.exists() else []
        )
        monitor = sorted(self.temp_dir.glob("session_*/logs/monitor.log"))
        if monitor:
            text += ["--- monitor.log ---", *monitor[-1].read_text(errors="replace").splitlines()]
        return "\n".join(text[-lines:])

    def stop(self) -> None:
        """Kill every process of the cluster at once: ``serve shutdown`` and ``ray stop``
        drain node by node (~40 s here), and nothing read after a run needs the drain."""
        procs = self.processes()
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(procs, timeout=10)


@contextlib.contextmanager
def local_cluster(
    shape: ClusterShape,
    work: Path,
    timeout_s: float = 180,
    ray_settings: dict[str, str] | None = None,
) -> Iterator[LocalCluster]:
    """A started cluster; every process of it stopped on exit."""
    work.mkdir(parents=True, exist_ok=True)
    # Short: Ray's unix socket paths live under it (108 bytes at most).
    temp_dir = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))
    cluster = LocalCluster(
        shape=shape,
        temp_dir=temp_dir,
        gcs_port=free_port(),
        dashboard_port=free_port(),
        log_path=work / "cluster.log",
        ray_settings=dict(ray_settings or {}),
    )
    try:
        cluster.start(timeout_s)
        yield cluster
    finally:
        cluster.stop()
        # Ray's session logs of every node (hundreds of MB after a soak); the cluster's
        # own log stays in ``work``.
        shutil.rmtree(temp_dir, ignore_errors=True)


def deployable(serve_config_v2: str, port: int) -> dict[str, Any]:
    """A RayService's serveConfigV2 with this machine's HTTP address: every node of a
    local cluster shares one host, and the tests talk to 127.0.0.1 only."""
    config: dict[str, Any] = yaml.safe_load(serve_config_v2)
    config["http_options"] = {**config.get("http_options", {}), "host": "127.0.0.1", "port": port}
    return config


def deploy_rayservice(
    cluster: LocalCluster, rayservice: dict[str, Any], timeout_s: float = 600
) -> str:
    """Deploy the manifest's serveConfigV2 and wait for the graph's /health; its base URL."""
    port = free_port()
    cluster.deploy(deployable(rayservice["spec"]["serveConfigV2"], port))
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base_url}/health", timeout=10).status_code == 200:
                return base_url
        time.sleep(2)
    raise TimeoutError(f"graph not healthy after {timeout_s}s:\n{cluster.log_tail()}")


def set_client_env() -> None:
    """This process as a client of a token-auth cluster (state API calls).

    Ray reads ``RAY_AUTH_MODE`` into a cached config when it is first imported,
    which in a test session happens long before (collecting other tests), so the
    cache is refreshed as Ray's own ``_enable_token_auth`` does; without it every
    state API call fails with ``InvalidAuthToken``."""
    os.environ.update(client_env())
    os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()
