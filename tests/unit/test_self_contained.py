"""A clone of the repo is all a user gets: nothing it runs reads beside the checkout."""

from __future__ import annotations

import re
from pathlib import Path

from deployments.config.graph_config import REPO_ROOT

# A path into a folder beside the checkout: "../shared", or a parent of the repo joined
# to a name ("parents[2].parent / 'shared'", "REPO.parent / ...").
OUTSIDE = re.compile(r"\.\./shared|\.parent\s*/\s*[\"']shared[\"']|REPO(?:_ROOT)?\.parent\b")
FOLDERS = ("deployments", "bench", "scripts", "tests", "k8s", "configs", "docs")


def sources() -> list[Path]:
    files = [REPO_ROOT / name for name in ("Makefile", "graph.py", "README.md", "pyproject.toml")]
    for folder in FOLDERS:
        files += [
            p for p in (REPO_ROOT / folder).rglob("*")
            if p.suffix in {".py", ".md", ".yaml", ".toml", ".sh"} and "kuberay" not in p.parts
        ]  # fmt: skip
    return files


def test_no_code_test_or_doc_reads_outside_the_repo() -> None:
    here = Path(__file__).resolve()
    readers = [
        str(p.relative_to(REPO_ROOT))
        for p in sources()
        if p.resolve() != here and OUTSIDE.search(p.read_text())
    ]
    assert readers == []


def test_the_pattern_finds_what_it_is_for() -> None:
    assert OUTSIDE.search('Path(__file__).parents[2].parent / "shared" / "kuberay"')
    assert OUTSIDE.search("see ../shared/seed/")
    assert not OUTSIDE.search('Result("prefix", "shared")')
