"""Marks each test by the suite it lies in (its first folder under ``tests/``): unit,
integration, e2e or cluster, however deep it sits there; keeps streams' files in the
session's temporary directory."""

from __future__ import annotations

from pathlib import Path

import pytest

# Snapshot the environment before any test module imports vLLM (see servers.py).
import bench.harness.servers  # noqa: F401
from bench.harness import sse_reader

TESTS = Path(__file__).resolve().parent
SUITES = ("unit", "integration", "e2e", "cluster")


def suite_of(path: Path) -> str | None:
    """The suite a test file belongs to, by its path under ``tests/``."""
    parts = path.resolve().relative_to(TESTS).parts
    return parts[0] if len(parts) > 1 and parts[0] in SUITES else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        suite = suite_of(Path(str(item.fspath)))
        if suite is None:
            raise pytest.UsageError(f"{item.nodeid} lies in no suite folder: {SUITES}")
        item.add_marker(getattr(pytest.mark, suite))


@pytest.fixture(scope="session", autouse=True)
def _streams_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    sse_reader.STREAMS_DIR = tmp_path_factory.mktemp("streams")
