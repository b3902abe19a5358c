"""The dependency rule of ``docs/architecture.md``, held on every import of the code.

Layers, lowest first; a module may import the project's modules of its own
layer's package and of lower layers only (lazy imports inside functions count):

0. ``deployments.config``, ``deployments.messages``: nothing of the project;
   ``deployments.observability``: the graph's metrics, recorded through Ray in every
   layer and read back from Ray's agents, nothing of the project either;
1. ``deployments.transport``: Serve's handles and channels, and the one door to
   Serve's private state; ``deployments.scaling``: what CPU tiers report to Serve's
   autoscaler, and the policy it runs on it;
2. ``deployments.vllm_adapter``: the one door to vLLM's internals, engine start;
3. ``deployments.text``, ``deployments.routing`` (not each other);
4. ``deployments.edge``: the HTTP edge; ``deployments.declarations``: how Serve is
   told of each deployment, by its class's import path (not the class: building
   the graph imports no replica's code, and so no vLLM);
5. the deployments (``deployments/<name>.py``), then ``graph.py``.

``deployments`` imports neither ``bench`` nor ``tests``; ``bench`` does not import
``tests``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from deployments.config.graph_config import REPO_ROOT

LAYERS: dict[str, int] = {
    "config": 0,
    "messages": 0,
    "observability": 0,
    "transport": 1,
    "scaling": 1,
    "vllm_adapter": 2,
    "text": 3,
    "routing": 3,
    "edge": 4,
    "declarations": 4,
}
TOP = 5  # the deployment modules
GRAPH = 6


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of its code."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            raise AssertionError(f"{path}: a relative import; the rule reads absolute ones")
    return found


def layer_of(module: str) -> tuple[int, str] | None:
    """(layer, package) of a module of the graph; None for anything else."""
    parts = module.split(".")
    if parts[0] == "graph":
        return GRAPH, "graph"
    if parts[0] != "deployments" or len(parts) < 2:
        return None
    if parts[1] in LAYERS:
        return LAYERS[parts[1]], parts[1]
    return TOP, parts[1]


SOURCES = sorted(
    p
    for p in [*(REPO_ROOT / "deployments").rglob("*.py"), REPO_ROOT / "graph.py"]
    if p.name != "__init__.py"
)


def violations(module: str, imported: set[str]) -> list[str]:
    """The imports of ``module`` that break the rule."""
    me = layer_of(module)
    assert me is not None, module
    broken = []
    for name in sorted(imported):
        if name.split(".")[0] in ("bench", "tests"):
            broken.append(f"{name} (bench and tests are not part of the graph)")
            continue
        theirs = layer_of(name)
        if theirs is None or theirs[1] == me[1]:
            continue
        if theirs[0] >= me[0] and not (me[0] == TOP and theirs[0] == TOP):
            broken.append(f"{name} (layer {theirs[0]} from layer {me[0]})")
    return broken


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_each_module_imports_only_its_own_and_lower_layers(path: Path) -> None:
    assert not violations(module_name(path), imports_of(path))


@pytest.mark.parametrize(
    ("module", "imported"),
    [
        ("deployments.text.output", "deployments.edge.errors"),  # up
        ("deployments.text.output", "deployments.routing.block_keys"),  # across
        ("deployments.transport.coalesce", "deployments.vllm_adapter.internals"),
        ("deployments.config.graph_config", "deployments.messages.tier"),
        ("deployments.edge.guard", "deployments.ingress"),
        ("deployments.declarations.ingress", "deployments.ingress"),  # by path only
        ("deployments.declarations.ingress", "deployments.edge.errors"),
        ("deployments.render", "graph"),
        ("deployments.generate", "tests.support.request_fuzz"),
    ],
)
def test_the_rule_catches(module: str, imported: str) -> None:
    assert violations(module, {imported}), f"{module} may not import {imported}"


def test_the_rule_allows_down_within_and_between_deployments() -> None:
    assert not violations("deployments.edge.tier_calls", {"deployments.text.sse"})
    assert not violations("deployments.text.output", {"deployments.text.sse", "vllm"})
    assert not violations("deployments.derender", {"deployments.render"})
    assert not violations("graph", {"deployments.ingress"})


def test_every_package_has_a_layer_and_an_empty_init() -> None:
    packages = [p.parent for p in (REPO_ROOT / "deployments").glob("*/__init__.py")]
    assert {p.name for p in packages} == set(LAYERS)
    # Empty: importing a package must not import its modules (the control plane's
    # replica would pull in vLLM through one). The root's docstring imports nothing.
    assert all(not (p / "__init__.py").read_text().strip() for p in packages)
    assert not imports_of(REPO_ROOT / "deployments" / "__init__.py")


def test_bench_never_imports_tests() -> None:
    offenders = [
        str(p.relative_to(REPO_ROOT))
        for p in (REPO_ROOT / "bench").rglob("*.py")
        if any(i.split(".")[0] == "tests" for i in imports_of(p))
    ]
    assert not offenders, offenders
