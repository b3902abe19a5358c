"""What one Generate replica's engine holds in its prefix cache, from the engine's own events.

The engine publishes KV cache events (``--kv-events-config``) on a ZMQ
socket private to this replica (``ipc://``, bound by the engine core); the
replica subscribes, keeps the set of block keys its engine holds, and hands
that set to Serve as routing stats (``Generate.record_routing_stats``), from
where Serve's controller pushes it to every router of the deployment
(``prefix_router.py``). A batch lost on the socket (the sequence jumps) is
counted and logged; blocks it stored stay unknown until they are stored
again, and blocks it removed stay listed until the engine removes or clears them.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from array import array
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from deployments.routing.block_keys import BlockEvents, BlockKeying, decode_events

logger = logging.getLogger("ray.serve")

ROUTING_STATS_KEY = "kv_blocks"
# The fraction of the engine's KV cache in use at its last step (vllm_adapter/engine_load.py).
KV_USE_KEY = "kv_cache_use"
# The step channels the replica serves, which Serve counts in its queue length.
CHANNELS_KEY = "step_channels"
# The requests it runs that came on request channels, which Serve does not count.
CHANNEL_REQUESTS_KEY = "channel_requests"


def events_endpoint(replica: str) -> str:
    """An ``ipc://`` endpoint of this host that only this replica's engine binds."""
    return f"ipc://{Path(tempfile.gettempdir()) / f'scaleout-kv-{replica}.ipc'}"


class EngineBlocks:
    """The block keys an engine holds, kept from its events."""

    def __init__(self, keying: BlockKeying):
        self.keying = keying
        self._held: set[int] = set()
        self.version = 0
        self._stats: dict[str, Any] | None = None

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, key: int) -> bool:
        return key in self._held

    def apply(self, events: Iterable[BlockEvents]) -> None:
        for event in events:
            if event.cleared:
                self._held.clear()
            self._held.difference_update(event.removed)
            self._held.update(event.stored)
        self.version += 1
        self._stats = None

    def routing_stats(self) -> dict[str, Any]:
        """Plain values only: Serve's controller unpickles them without this module."""
        if self._stats is None:
            self._stats = {
                "version": self.version,
                "block_size": self.keying.block_size,
                "hash_algo": self.keying.hash_algo,
                "seed": self.keying.seed,
                "blocks": array("Q", self._held).tobytes(),
            }
        return self._stats


class EventSubscriber:
    """Reads the engine's event socket into an :class:`EngineBlocks` on this loop."""

    def __init__(self, endpoint: str, blocks: EngineBlocks):
        self._endpoint = endpoint
        self._blocks = blocks
        self._task: asyncio.Task[None] | None = None
        self.lost_batches = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        path = self._endpoint.removeprefix("ipc://")
        Path(path).unlink(missing_ok=True)

    async def _run(self) -> None:
        import zmq
        import zmq.asyncio

        context = zmq.asyncio.Context.instance()
        socket = context.socket(zmq.SUB)
        socket.setsockopt(zmq.SUBSCRIBE, b"")
        socket.connect(self._endpoint)
        last_seq: int | None = None
        try:
            while True:
                _topic, seq_bytes, payload = await socket.recv_multipart()
                seq = int.from_bytes(seq_bytes, "big")
                if last_seq is not None and seq != last_seq + 1:
                    self.lost_batches += seq - last_seq - 1
                    logger.warning("KV events: %d batch(es) lost", seq - last_seq - 1)
                last_seq = seq
                self._blocks.apply(decode_events(payload))
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("KV event subscriber stopped; routing sees this engine as it last was")
        finally:
            socket.close(linger=0)
