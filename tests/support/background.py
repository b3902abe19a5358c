"""Long checks that need one otherwise idle core, run beside the suite.

A check registered here for a test starts, ``nice``-d, as soon as collection
has picked that test, and the test reads its result when it runs: the check
takes the CPU the rest of the suite leaves idle (waits on engines, streams and
replicas) instead of a slot of its own in the suite's wall time. What it checks
is unchanged; a test that was not collected starts nothing.
"""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REGISTRY: dict[str, Background] = {}


@dataclass
class Background:
    argv: list[str]
    cwd: Path
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _out: Path | None = None

    def start(self) -> None:
        if self._process is not None:
            return
        self._out = Path(tempfile.mkdtemp(prefix="background-")) / "output.txt"
        with self._out.open("wb") as out:
            self._process = subprocess.Popen(
                ["nice", "-n", "19", *self.argv],
                cwd=self.cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def result(self, timeout_s: float) -> tuple[int, str]:
        """(exit status, output) once the check ends; started now if it was not."""
        self.start()
        assert self._process is not None and self._out is not None
        status = self._process.wait(timeout=timeout_s)
        return status, self._out.read_text(errors="replace")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()


def background(test_name: str, argv: list[str], cwd: Path) -> Background:
    """The check behind ``test_name``, started once collection has picked that test."""
    check = REGISTRY[test_name] = Background(argv, cwd)
    return check


def start_for(test_names: set[str]) -> None:
    for name, check in REGISTRY.items():
        if name in test_names:
            check.start()


def stop_all() -> None:
    for check in REGISTRY.values():
        check.stop()
