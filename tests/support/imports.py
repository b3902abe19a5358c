"""What a fresh interpreter has imported of the heavy libraries after some code.

The replicas that must start light (the Ingress, the control plane) and the
process that builds the graph import no vLLM; these tests run the code in a
new process, since this one has imported vLLM long before.
"""

from __future__ import annotations

import subprocess
import sys

from bench.harness.servers import REPO

HEAVY = ("vllm", "torch", "transformers")


def heavy_modules_after(code: str) -> list[str]:
    """Which of ``HEAVY`` a fresh interpreter in the checkout holds after ``code``."""
    probe = f"import sys\n{code}\nprint(','.join(sorted(set({HEAVY!r}) & set(sys.modules))))"
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return [name for name in result.stdout.strip().split(",") if name]
