"""The command line a bench writes at the top of its doc: what reproduces the run."""

from __future__ import annotations

import argparse
from collections.abc import Iterable


def reproducing_command(
    module: str,
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    skip: Iterable[str] = ("work", "out", "report_only"),
) -> str:
    """``python -m <module>``, every option whose value differs from its default (less
    ``skip``, which only say where files go), and ``--out``."""
    defaults = {a.dest: a.default for a in parser._actions if a.dest != "help"}
    # A switch (store_true/store_false) is written bare: it takes no value.
    switches = {a.dest for a in parser._actions if a.nargs == 0 and a.dest != "help"}
    left_out = set(skip)
    changed = [
        f"--{name.replace('_', '-')}" + ("" if name in switches else f" {value}")
        for name, value in vars(args).items()
        if name in defaults and name not in left_out and value != defaults[name]
    ]
    return " ".join([f"python -m {module}", *changed, f"--out {args.out}"])
