"""Marks each test by the suite it lies in (its first folder under ``tests/``): unit,
integration, e2e or cluster, however deep it sits there; keeps streams' files in the
session's temporary directory."""

from __future__ import annotations

from pathlib import Path

import pytest

# Snapshot the environment before any test module imports vLLM (see servers.py).
import bench.harness.servers  # noqa: F401
from bench.harness import sse_reader
from tests.support import background

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


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the background checks of the tests this session runs (``background``)."""
    background.start_for({item.name for item in session.items})


def pytest_sessionfinish(session: pytest.Session) -> None:
    background.stop_all()


@pytest.fixture(scope="session", autouse=True)
def _streams_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    sse_reader.STREAMS_DIR = tmp_path_factory.mktemp("streams")
