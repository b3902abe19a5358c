"""Serve's replica log keeps writing after a dictConfig (what vLLM's engine start does)."""

from __future__ import annotations

import logging
import logging.config
import logging.handlers
from collections.abc import Iterator
from pathlib import Path

import pytest

from deployments.transport.serve_internals import serve_logger_name
from deployments.vllm_adapter.serve_logging import serve_log_kept

# What vLLM's configure_logging applies: not incremental, existing loggers kept.
VLLM_LIKE = {"version": 1, "disable_existing_loggers": False}


@pytest.fixture
def serve_logger(tmp_path: Path) -> Iterator[tuple[logging.Logger, Path]]:
    """The ray.serve logger as Serve sets it up in a replica: a buffer over a file."""
    logger = logging.getLogger(serve_logger_name())
    saved = logger.handlers[:], logger.level, logger.propagate
    path = tmp_path / "replica.log"
    buffer = logging.handlers.MemoryHandler(100, target=logging.FileHandler(path))
    logger.handlers[:] = [buffer]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield logger, path
    buffer.close()
    logger.handlers[:], logger.level, logger.propagate = saved


def buffers(logger: logging.Logger) -> list[logging.handlers.MemoryHandler]:
    # pytest adds capture handlers of its own beside ours.
    return [h for h in logger.handlers if isinstance(h, logging.handlers.MemoryHandler)]


def test_a_dict_config_closes_serves_buffered_handler(
    serve_logger: tuple[logging.Logger, Path],
) -> None:
    """The failure this module exists for: the handler loses its file."""
    logger, _ = serve_logger
    logging.config.dictConfig(VLLM_LIKE)
    (buffer,) = buffers(logger)
    assert buffer.target is None


def test_serve_log_kept_gives_the_handler_its_file_back(
    serve_logger: tuple[logging.Logger, Path],
) -> None:
    logger, path = serve_logger
    with serve_log_kept():
        logging.config.dictConfig(VLLM_LIKE)
    (buffer,) = buffers(logger)
    assert isinstance(buffer.target, logging.FileHandler)
    assert buffer.target.baseFilename == str(path)  # what Serve's is_allocated reads
    logger.info("after the engine started")
    buffer.flush()
    assert "after the engine started" in path.read_text()
