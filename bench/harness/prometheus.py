"""A real Prometheus server (Debian's ``prometheus``, ``make prometheus``) for a test
or a benchmark: started on a free loopback port with the scrape config given, queried
over its HTTP API."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.harness.servers import free_port

STARTUP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Prometheus:
    url: str

    def query(self, expression: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result vector (``/api/v1/query``), now or ``at`` (Unix s)."""
        params: dict[str, Any] = {"query": expression}
        if at is not None:
            params["time"] = at
        response = httpx.get(f"{self.url}/api/v1/query", params=params)
        response.raise_for_status()
        answer = response.json()
        assert answer["status"] == "success", answer
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def query_range(
        self, expression: str, start: float, end: float, step_s: float
    ) -> list[dict[str, Any]]:
        """A range query's matrix (``/api/v1/query_range``), times in Unix seconds."""
        response = httpx.get(
            f"{self.url}/api/v1/query_range",
            params={"query": expression, "start": start, "end": end, "step": step_s},
        )
        response.raise_for_status()
        answer = response.json()
        assert answer["status"] == "success", answer
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def value(self, expression: str, at: float | None = None) -> float | None:
        """The one value of an expression that yields one series (None: no series)."""
        result = self.query(expression, at)
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None

    def targets_up(self) -> dict[str, str]:
        """Each active target's scrape URL → its health (``up``, ``down``, ``unknown``)."""
        response = httpx.get(f"{self.url}/api/v1/targets")
        response.raise_for_status()
        return {t["scrapeUrl"]: t["health"] for t in response.json()["data"]["activeTargets"]}


@contextlib.contextmanager
def running_prometheus(tmp_dir: Path, scrape_configs: list[dict[str, Any]]) -> Iterator[Prometheus]:
    """Prometheus scraping ``scrape_configs`` every second, stopped after."""
    binary = shutil.which("prometheus")
    assert binary, "Debian's prometheus is not installed: make install installs it"
    config = tmp_dir / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": scrape_configs,
            }
        )
    )
    port = free_port()
    log = (tmp_dir / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    server = Prometheus(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            assert process.poll() is None, (tmp_dir / "prometheus.log").read_text()[-3000:]
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{server.url}/-/ready").status_code == 200:
                    break
            assert time.monotonic() < deadline, "prometheus did not become ready"
            time.sleep(0.2)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
