"""A benchmark's graph variants on the command line: ``NAME:K=V,...``."""

from __future__ import annotations


def variant_pairs(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """``K=V,...`` as (environment variables, graph args): an upper-case key is a
    variable (``RAY_…``), a lower-case one a ``GraphConfig`` key (dotted keys nest)."""
    pairs = dict(pair.split("=", 1) for pair in text.split(",") if pair)
    env = {k: v for k, v in pairs.items() if k[:1].isupper()}
    return env, {k: v for k, v in pairs.items() if k not in env}
