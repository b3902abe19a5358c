"""Tests are marked by the suite folder they lie in, at any depth below it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import TESTS, suite_of


@pytest.mark.parametrize(
    ("path", "suite"),
    [
        ("unit/test_control_plane.py", "unit"),
        ("unit/text/test_sse.py", "unit"),
        ("unit/a/b/test_deep.py", "unit"),
        ("integration/test_skeleton.py", "integration"),
        ("cluster/test_cluster.py", "cluster"),
        ("support/servers.py", None),
    ],
)
def test_suite_is_the_first_folder_under_tests(path: str, suite: str | None) -> None:
    assert suite_of(TESTS / path) == suite


def test_this_test_is_marked_unit(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("unit") is not None
    assert request.node.get_closest_marker("integration") is None


def test_every_test_file_lies_in_a_suite() -> None:
    loose = [
        p.relative_to(TESTS)
        for p in TESTS.rglob("test_*.py")
        if suite_of(p) is None and "support" not in p.parts
    ]
    assert not loose, loose
    assert suite_of(Path(__file__)) == "unit"
