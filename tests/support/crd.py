"""Validate Kubernetes objects against a CRD's openAPIV3Schema, offline.

As the API server does: nulls are dropped, schema defaults applied, unknown
fields rejected (unless ``x-kubernetes-preserve-unknown-fields``), and
``x-kubernetes-int-or-string`` accepts either. Plus the KubeRay operator's own
rules that its schema does not express.
"""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

# KubeRay's own CRDs and samples, vendored with their source (kuberay/README.md).
KUBERAY = Path(__file__).resolve().parent / "kuberay" / "v1.7.0"
UPGRADE_TYPES = {"NewCluster", "NewClusterWithIncrementalUpgrade", "None"}
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@functools.cache
def crd_schema(kind: str) -> dict[str, Any]:
    """The served version's openAPIV3Schema of ``kind`` (RayService, RayCluster)."""
    path = KUBERAY / "crds" / f"ray.io_{kind.lower()}s.yaml"
    crd = yaml.safe_load(path.read_text())
    version = next(v for v in crd["spec"]["versions"] if v.get("served") and v.get("storage"))
    return dict(version["schema"]["openAPIV3Schema"])


def to_json_schema(node: Any) -> Any:
    """OpenAPI v3 structural schema → JSON Schema with Kubernetes' extensions honoured."""
    if isinstance(node, list):
        return [to_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: to_json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    out.pop("default", None)  # applied beforehand, as the API server does
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    out.pop("nullable", None)
    if (
        node.get("type") == "object"
        and "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_nulls(v) for v in value]
    return value


def apply_defaults(value: Any, schema: dict[str, Any]) -> Any:
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key, sub in props.items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
        for key, item in value.items():
            if key in props:
                value[key] = apply_defaults(item, props[key])
            elif isinstance(schema.get("additionalProperties"), dict):
                value[key] = apply_defaults(item, schema["additionalProperties"])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(v, schema["items"]) for v in value]
    return value


def schema_errors(obj: dict[str, Any]) -> list[str]:
    schema = crd_schema(obj.get("kind", ""))
    doc = apply_defaults(drop_nulls(copy.deepcopy(obj)), schema)
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator_for(obj.get("kind", "")).iter_errors(doc)
    ]


@functools.cache
def validator_for(kind: str) -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(to_json_schema(crd_schema(kind)))


def cluster_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec", {})
    return [spec["rayClusterConfig"]] if obj.get("kind") == "RayService" else [spec]


def operator_errors(obj: dict[str, Any]) -> list[str]:
    """Rules the KubeRay operator enforces beyond the schema."""
    errors = []
    name = obj.get("metadata", {}).get("name", "")
    if len(name) > 47 or not DNS_1035.match(name):
        errors.append(f"metadata.name {name!r} must be a DNS-1035 label of at most 47 characters")
    if obj.get("kind") == "RayService":
        upgrade = obj.get("spec", {}).get("upgradeStrategy", {}).get("type")
        if upgrade is not None and upgrade not in UPGRADE_TYPES:
            errors.append(f"upgradeStrategy.type {upgrade!r} not in {sorted(UPGRADE_TYPES)}")
    for cluster in cluster_specs(obj):
        groups = [("head", cluster.get("headGroupSpec", {}))] + [
            (g.get("groupName", "?"), g) for g in cluster.get("workerGroupSpecs", [])
        ]
        for group, spec in groups:
            for key, value in (spec.get("rayStartParams") or {}).items():
                if not isinstance(value, str):
                    errors.append(f"{group}.rayStartParams.{key} must be a string")
            low, high = spec.get("minReplicas"), spec.get("maxReplicas")
            if low is not None and high is not None and low > high:
                errors.append(f"{group}: minReplicas {low} > maxReplicas {high}")
    return errors


def all_errors(obj: dict[str, Any]) -> list[str]:
    return schema_errors(obj) + operator_errors(obj)
