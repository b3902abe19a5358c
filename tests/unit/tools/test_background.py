"""Background checks: started only for a collected test, niced, read back whole."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support import background as bg


def test_a_check_starts_only_for_its_collected_test_and_runs_niced(tmp_path: Path) -> None:
    code = "import os; print('niceness', os.nice(0)); raise SystemExit(3)"
    check = bg.Background([sys.executable, "-c", code], tmp_path)
    bg.REGISTRY["test_wanted"] = check
    other = bg.Background([sys.executable, "-c", "print('never')"], tmp_path)
    bg.REGISTRY["test_not_collected"] = other
    try:
        bg.start_for({"test_wanted", "test_something_else"})
        assert other._process is None
        status, output = check.result(timeout_s=60)
        assert status == 3
        assert "niceness 19" in output
    finally:
        del bg.REGISTRY["test_wanted"], bg.REGISTRY["test_not_collected"]


def test_result_starts_a_check_that_was_not_started(tmp_path: Path) -> None:
    check = bg.Background([sys.executable, "-c", "print('done')"], tmp_path)
    assert check.result(timeout_s=60) == (0, "done\n")
