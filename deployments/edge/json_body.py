"""Request bodies as JSON, refused with a 400 where vLLM's server refuses them.

vLLM parses a body with Python's ``json``, which gives up near the
interpreter's recursion limit (1,000): ``"[" * 5000`` is a 400 there, a
700-deep ``chat_template_kwargs`` is served. Here the parsed body then crosses
tiers, pickled, and pickling takes two recursion levels per nesting level, so
the graph's replicas run with a higher limit (``allow_deep_values``) and the
edge caps nesting itself at vLLM's depth (``MAX_JSON_DEPTH``).

A JSON string may also hold a lone UTF-16 surrogate (``"\\ud800"``): Python
parses it, but no UTF-8 answer can carry it back. vLLM answers such input
400; so does this, before any tier sees it.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

MAX_JSON_DEPTH = 1000
"""Deepest nesting a body may have: what vLLM's parser takes, at the default limit."""
REPLICA_RECURSION_LIMIT = 5 * MAX_JSON_DEPTH
"""Enough to pickle, validate and copy a value nested ``MAX_JSON_DEPTH`` deep."""
# A surrogate escape; only such an escape can put a surrogate in a parsed string
# (UTF-8 cannot encode one), and a valid pair parses into one code point.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


class BadJson(ValueError):
    """The body is not JSON a tier can take; the message says why."""


def allow_deep_values() -> None:
    """Let this process pickle and validate values nested up to ``MAX_JSON_DEPTH``."""
    if sys.getrecursionlimit() < REPLICA_RECURSION_LIMIT:
        sys.setrecursionlimit(REPLICA_RECURSION_LIMIT)


def parse_json(body: bytes) -> Any:
    """``body`` parsed, or ``BadJson``."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadJson(f"JSON decode error: {exc}") from None
    except RecursionError:
        raise BadJson(f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    # Fewer brackets than the cap: no deeper nesting is possible, and no walk is paid.
    if body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH and (
        nesting_depth(data) > MAX_JSON_DEPTH
    ):
        raise BadJson(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    if _SURROGATE_ESCAPE.search(body) is not None and _has_lone_surrogate(data):
        raise BadJson("JSON string holds a lone UTF-16 surrogate, which UTF-8 cannot carry")
    return data


def nesting_depth(value: Any) -> int:
    """How deep arrays and objects nest in ``value`` (a scalar: 0), without recursion."""
    deepest = 0
    stack = [(value, 1)] if isinstance(value, (list, dict)) else []
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, (list, dict)):
                stack.append((child, depth + 1))
    return deepest


def _has_lone_surrogate(data: Any) -> bool:
    try:
        json.dumps(data, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return True
    return False
