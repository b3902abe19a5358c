"""Each Ray Serve private symbol the graph reads (``deployments/transport/serve_internals.py``)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

from deployments.transport.serve_internals import (
    drop_access_log_lines,
    proxy_request_id,
    replica_grpc_max_message_bytes,
    serve_logger_name,
)


def test_grpc_cap_is_read_from_serves_switch() -> None:
    """Serve reads the switch as the process starts: a fresh process with it set sees it."""
    code = (
        "from deployments.transport.serve_internals import replica_grpc_max_message_bytes as m;"
        "print(m())"
    )
    env = {**os.environ, "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH": str(123 * 2**20)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == str(123 * 2**20), out.stderr
    assert replica_grpc_max_message_bytes() > 0


def test_proxy_request_ids_are_uuid_strings() -> None:
    import uuid

    assert uuid.UUID(proxy_request_id()).version == 4


def test_a_deployment_declared_by_import_path_keeps_it_and_serves_its_class() -> None:
    """``declared``: Serve takes the path (through ``.options`` too) and its replica
    loader resolves it to the class itself, as a replica would run it."""
    from ray.serve.deployment import Deployment

    from deployments.control_plane import ControlPlane
    from deployments.transport.serve_internals import declared, replica_class

    path = "deployments.control_plane.ControlPlane"
    deployment = declared(path, name="Probe", max_ongoing_requests=7)
    assert isinstance(deployment, Deployment) and deployment.name == "Probe"
    assert deployment.options(num_replicas=2).func_or_class == path
    assert deployment.max_ongoing_requests == 7
    assert replica_class(path) is ControlPlane


def test_serve_request_id_is_empty_outside_a_request() -> None:
    from deployments.transport.serve_internals import serve_request_id

    assert serve_request_id() == ""


def test_dropped_access_lines_leave_serves_other_records() -> None:
    """Serve marks its access records in ``extra`` (``serve_access_log``); a replica that
    drops them keeps every other record of Serve's logger."""
    logger = logging.getLogger(serve_logger_name())
    filters = list(logger.filters)

    def record(**extra: object) -> logging.LogRecord:
        return logger.makeRecord(logger.name, logging.INFO, __file__, 1, "m", (), None, extra=extra)

    try:
        assert logger.filter(record(serve_access_log=True))
        drop_access_log_lines()
        drop_access_log_lines()  # once is enough: a second call adds nothing
        assert len(logger.filters) == len(filters) + 1
        assert not logger.filter(record(serve_access_log=True))
        assert logger.filter(record()) and logger.filter(record(serve_access_log=False))
    finally:
        logger.filters[:] = filters
