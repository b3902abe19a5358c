"""API-key guard: what is protected, and how keys compare."""

from __future__ import annotations

import pytest
from ray.serve.exceptions import BackPressureError

from deployments.guard import is_protected, key_matches
from deployments.http_io import failure_error


@pytest.mark.parametrize(
    ("path", "protected"),
    [
        ("/v1/chat/completions", True),
        ("/v1/models", True),
        ("/v1", True),
        ("/inference/v1/generate", True),
        ("/inference/v1/abort_requests", True),
        ("/health", False),
        ("/metrics", False),
        ("/abort_requests", False),
        ("/v10/x", False),
    ],
)
def test_protected_paths(path: str, protected: bool) -> None:
    assert is_protected(path) is protected


def test_key_comparison() -> None:
    assert key_matches("Bearer sk-1", "sk-1")
    assert key_matches("bearer sk-1", "sk-1")
    assert not key_matches("Bearer sk-2", "sk-1")
    assert not key_matches("sk-1", "sk-1")
    assert not key_matches(None, "sk-1")
    assert not key_matches("Basic sk-1", "sk-1")


def test_overload_maps_to_503() -> None:
    error = failure_error(BackPressureError(num_queued_requests=3, max_queued_requests=2))
    assert error.error.code == 503
    assert error.error.type == "ServiceUnavailableError"
    assert failure_error(RuntimeError("boom")).error.code == 503
