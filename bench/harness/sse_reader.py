"""Read SSE streams with curl processes, as independent clients would.

Why not Python reader threads or processes: the tiny engine makes a 4,000-token
stream in about 2 s, and Ray's workers run at nice 15 while a test process
runs at nice 0. Python readers parsing events at that rate took the CPU from
the very server they measured (streams stretched to 10-20 s, first events
arrived seconds late, and aborts found finished requests). curl reads a
stream for almost no CPU; the test only looks at what it wrote.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

CURL = shutil.which("curl")
# Where each stream keeps its body, headers and trace; a test session points it
# at its own temporary directory (tests/conftest.py), which pytest prunes.
STREAMS_DIR: Path | None = None


class Stream:
    """One streamed POST, read by its own curl process."""

    def __init__(self, base_url: str, path: str, body: dict[str, Any], headers: dict[str, str]):
        if CURL is None:
            raise RuntimeError("the streaming tests need curl on PATH")
        self._dir = Path(tempfile.mkdtemp(prefix="sse-", dir=STREAMS_DIR))
        (self._dir / "body.json").write_text(json.dumps(body))
        self._argv = [
            CURL,
            "--silent",
            "--no-buffer",
            "--max-time",
            "180",
            "--output",
            str(self._dir / "body.sse"),
            "--dump-header",
            str(self._dir / "headers.txt"),
            "--write-out",
            "%{http_code}",
            "--header",
            "Content-Type: application/json",
            *[arg for name, value in headers.items() for arg in ("--header", f"{name}: {value}")],
            "--data-binary",
            f"@{self._dir / 'body.json'}",
            base_url.rstrip("/") + path,
        ]
        self._process: subprocess.Popen[str] | None = None
        self._waiter: threading.Thread | None = None
        self._status = ""
        self.ended_at = 0.0

    def start(self) -> None:
        self._process = subprocess.Popen(
            self._argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self._waiter = threading.Thread(target=self._wait, daemon=True)
        self._waiter.start()

    def _wait(self) -> None:
        assert self._process is not None
        self._status, _ = self._process.communicate()
        self.ended_at = time.monotonic()

    def wait_first(self, timeout_s: float) -> bool:
        """True once the first complete event arrived (or curl ended) within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._raw_events() or self.ended_at:
                return True
            time.sleep(0.01)
        return False

    def join(self, timeout_s: float) -> None:
        assert self._waiter is not None
        self._waiter.join(timeout_s)

    def kill(self) -> None:
        """Drop the connection without a goodbye, as a crashed client would."""
        assert self._process is not None
        self._process.kill()
        self.join(10)

    def _raw_events(self) -> list[str]:
        path = self._dir / "body.sse"
        text = path.read_text(errors="replace") if path.exists() else ""
        *complete, _ = text.split("\n\n")
        return [block[6:] for block in complete if block.startswith("data: ")]

    @property
    def error(self) -> str | None:
        """Why the stream failed once curl ended (transport or HTTP status); None otherwise."""
        if self._process is None or not self.ended_at:
            return None
        if self._process.returncode != 0:
            return f"curl exited {self._process.returncode}"
        if self._status.strip() != "200":
            return f"HTTP {self._status.strip()}: {(self._dir / 'body.sse').read_text()[:500]}"
        return None

    @property
    def body(self) -> str:
        """What the server sent so far (the JSON of a response that is not a stream)."""
        path = self._dir / "body.sse"
        return path.read_text(errors="replace") if path.exists() else ""

    @property
    def headers(self) -> dict[str, str]:
        """Response headers (lower-case names), known from the first event on."""
        path = self._dir / "headers.txt"
        lines = path.read_text().splitlines()[1:] if path.exists() else []
        return {
            name.strip().lower(): value.strip()
            for name, sep, value in (line.partition(":") for line in lines)
            if sep
        }

    @property
    def stream_id(self) -> str:
        event = json.loads(self._raw_events()[0])
        return str(event.get("id") or event["request_id"])

    @property
    def events(self) -> list[Any]:
        return [d if d == "[DONE]" else json.loads(d) for d in self._raw_events()]

    def finish_reasons(self) -> list[str]:
        return [
            c["finish_reason"]
            for e in self.events
            if isinstance(e, dict)
            for c in e.get("choices", [])
            if c.get("finish_reason")
        ]

    def token_count(self) -> int:
        usage = [e["usage"] for e in self.events if isinstance(e, dict) and e.get("usage")]
        return int(usage[-1]["completion_tokens"]) if usage else -1


def start_together(streams: list[Stream]) -> None:
    """Start every stream's curl back to back."""
    for stream in streams:
        stream.start()
