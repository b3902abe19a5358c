"""Marks each test by its folder: unit, integration or e2e."""

from __future__ import annotations

from pathlib import Path

import pytest

# Snapshot the environment before any test module imports vLLM (see servers.py).
import tests.support.servers  # noqa: F401

_FOLDER_MARKS = {"unit", "integration", "e2e"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(str(item.fspath)).parent.name
        if folder in _FOLDER_MARKS:
            item.add_marker(getattr(pytest.mark, folder))
