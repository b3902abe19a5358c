"""A RayService's node groups as a local cluster's shape, and the Ray autoscaler's
config for it (the fake multi-node provider's, ``cluster.py``): each group's
resources as KubeRay gives them to its pods' raylets, its node counts, and how a
node's resources tell its group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The fake provider's ids (ray.autoscaler._private.fake_multi_node.node_provider).
FAKE_HEAD_NODE_ID = "fffffffffffffffffffffffffffffffffffffffffffffffffff00000"
HEAD_GROUP = "headgroup"  # KubeRay's name for the head's node group


@dataclass(frozen=True)
class NodeGroup:
    name: str
    resources: dict[str, float]
    min_nodes: int
    max_nodes: int


@dataclass(frozen=True)
class ClusterShape:
    head_cpus: float
    groups: tuple[NodeGroup, ...]
    idle_timeout_s: float

    @classmethod
    def of(cls, rayservice: dict[str, Any]) -> ClusterShape:
        """The node groups of a RayService manifest, as Ray resources per node."""
        spec = rayservice["spec"]["rayClusterConfig"]
        groups = tuple(
            NodeGroup(
                name=group["groupName"],
                resources={
                    "CPU": _logical_cpus(group),
                    **{k: float(v) for k, v in group.get("resources", {}).items()},
                },
                min_nodes=int(group.get("minReplicas", 0)),
                max_nodes=int(group["maxReplicas"]),
            )
            for group in spec["workerGroupSpecs"]
        )
        return cls(
            head_cpus=_logical_cpus(spec["headGroupSpec"]),
            groups=groups,
            idle_timeout_s=float(spec.get("autoscalerOptions", {}).get("idleTimeoutSeconds", 60)),
        )

    def group_of(self, resources: dict[str, float]) -> str:
        """The node group whose nodes offer these CPUs and custom resources.

        Not the ``ray.io/node-group`` label, which KubeRay sets from each pod's
        environment: the fake provider starts every node from the autoscaler's
        own process, so all of them carry that process's labels."""
        for group in self.groups:
            # A resource a node offers none of is absent from its totals.
            if all(resources.get(k, 0.0) == v for k, v in group.resources.items()) and not (
                set(resources) & self._custom_resources() - set(group.resources)
            ):
                return group.name
        return "?"

    def _custom_resources(self) -> set[str]:
        return {k for g in self.groups for k in g.resources if k != "CPU"}

    def autoscaling_config(self, gcs_address: str) -> dict[str, Any]:
        """The fake provider's cluster config (Ray's fake_multi_node/example.yaml)."""
        node_types: dict[str, Any] = {
            group.name: {
                "resources": dict(group.resources),
                "node_config": {},
                "min_workers": group.min_nodes,
                "max_workers": group.max_nodes,
            }
            for group in self.groups
        }
        node_types["ray.head.default"] = {
            "resources": {"CPU": self.head_cpus},
            "node_config": {},
            "max_workers": 0,
        }
        return {
            "cluster_name": "scaleout-local",
            "max_workers": sum(group.max_nodes for group in self.groups),
            "provider": {
                # fake_multinode by module: with type "fake_multinode" the autoscaler reads
                # its defaults from fake_multi_node/example.yaml, which the wheel lacks.
                "type": "external",
                "module": "ray.autoscaler._private.fake_multi_node.node_provider."
                "FakeMultiNodeProvider",
                "use_node_id_as_ip": True,
                "disable_node_updaters": True,
                "disable_launch_config_check": True,
                "launch_multiple": True,
                "head_node_id": FAKE_HEAD_NODE_ID,
                "gcs_address": gcs_address,
            },
            "available_node_types": node_types,
            "head_node_type": "ray.head.default",
            "auth": {},
            "upscaling_speed": 1.0,
            "idle_timeout_minutes": self.idle_timeout_s / 60,
            "docker": {},
            "initialization_commands": [],
            "setup_commands": [],
            "head_setup_commands": [],
            "worker_setup_commands": [],
            "head_start_ray_commands": [],
            "worker_start_ray_commands": [],
            "file_mounts": {},
            "cluster_synced_files": [],
            "file_mounts_sync_continuously": False,
            "rsync_exclude": [],
            "rsync_filter": [],
        }


def _logical_cpus(group: dict[str, Any]) -> float:
    """``num-cpus`` of rayStartParams, else the container's CPU limit (KubeRay's rule)."""
    params = group.get("rayStartParams", {})
    if "num-cpus" in params:
        return float(params["num-cpus"])
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    cpu = str(limits["cpu"])
    return float(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
