"""Marks each test by its folder: unit, integration, e2e or cluster; keeps streams' files in
the session's temporary directory."""

from __future__ import annotations

from pathlib import Path

import pytest

# Snapshot the environment before any test module imports vLLM (see servers.py).
import tests.support.servers  # noqa: F401
from tests.support import sse_reader

_FOLDER_MARKS = {"unit", "integration", "e2e", "cluster"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(str(item.fspath)).parent.name
        if folder in _FOLDER_MARKS:
            item.add_marker(getattr(pytest.mark, folder))


@pytest.fixture(scope="session", autouse=True)
def _streams_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    sse_reader.STREAMS_DIR = tmp_path_factory.mktemp("streams")
