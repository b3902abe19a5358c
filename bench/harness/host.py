"""The host a bench ran on, in one line: machines differ in CPU (AVX-512 or AVX2) and in
speed, so a figure is read with the CPU that made it."""

from __future__ import annotations

import contextlib
import platform
from pathlib import Path
from typing import Any

import psutil


def cpu_text() -> str:
    """The CPU's model name and its widest vector extension, e.g. ``AMD EPYC …, AVX-512``."""
    model = flags = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = line
    simd = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{model or 'unknown CPU'}, {simd}"


def host_line() -> str:
    """``x86_64, 2 CPUs (AMD EPYC …, AVX-512), 24 GiB``."""
    memory = psutil.virtual_memory().total / 2**30
    return f"{platform.machine()}, {psutil.cpu_count()} CPUs ({cpu_text()}), {memory:.0f} GiB"


def recorded_host_line(host: dict[str, Any]) -> str:
    """A run's host as its results recorded it: ``host_line()`` under ``line``, or, in
    runs from before the CPU was recorded, the machine and its CPUs."""
    return str(host.get("line") or f"{host['machine']}, {host['cpus']} CPUs")
