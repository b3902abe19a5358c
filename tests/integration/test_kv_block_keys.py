"""The router names blocks exactly as a vLLM engine does.

Oracle: vLLM's own OpenAI server (``vllm_server``), publishing its KV cache
events. A prompt of fresh random token ids goes in through ``/v1/completions``,
with and without a ``cache_salt``; the block keys the engine reports storing
must be the keys ``BlockKeying`` computes for those ids, with vLLM's default
hash and seed (the graph's Generate replicas run with the same).
"""

from __future__ import annotations

import random
import time
import uuid

import httpx
import pytest
import zmq

from bench.harness.servers import Server
from deployments.routing.block_keys import BlockKeying, decode_events
from tests.integration.conftest import MODEL

# vLLM's CPU attention block; the engine's events carry it too, checked below.
CPU_BLOCK_SIZE = 128
PROMPT_BLOCKS = 3


def stored_keys(socket: zmq.Socket[bytes], timeout_s: float = 10) -> tuple[list[int], set[int]]:
    """Keys of the blocks stored until the socket is quiet, and the block sizes seen."""
    import msgspec
    from vllm.distributed.kv_events import BlockStored, KVEventBatch

    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    keys: list[int] = []
    sizes: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not socket.poll(timeout=1000):
            if keys:
                break
            continue
        _topic, _seq, payload = socket.recv_multipart()
        for events in decode_events(payload):
            keys.extend(events.stored)
        sizes |= {
            e.block_size for e in decoder.decode(payload).events if isinstance(e, BlockStored)
        }
    return keys, sizes


@pytest.fixture
def events(vllm_kv_events: str) -> zmq.Socket[bytes]:
    socket = zmq.Context.instance().socket(zmq.SUB)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    socket.connect(vllm_kv_events)
    time.sleep(0.5)  # ZMQ's slow joiner: a SUB misses what is published before it is connected
    yield socket
    socket.close(linger=0)


@pytest.mark.parametrize("cache_salt", [None, "tenant-a"])
def test_router_block_keys_equal_the_engines_own(
    vllm_server: Server, events: zmq.Socket[bytes], cache_salt: str | None
) -> None:
    rng = random.Random(uuid.uuid4().int)  # never a prompt the engine already holds
    prompt = [rng.randrange(10, 1000) for _ in range(PROMPT_BLOCKS * CPU_BLOCK_SIZE + 17)]
    body: dict[str, object] = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
    if cache_salt:
        body["cache_salt"] = cache_salt
    reply = httpx.post(f"{vllm_server.base_url}/v1/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text

    keys, sizes = stored_keys(events)
    assert sizes == {CPU_BLOCK_SIZE}
    ours = BlockKeying(CPU_BLOCK_SIZE, "sha256", "vllm-none-hash").keys(prompt, cache_salt)
    assert len(ours) == PROMPT_BLOCKS
    assert keys[:PROMPT_BLOCKS] == ours
    if cache_salt:  # the salt reaches the key: without it, other keys
        assert BlockKeying(CPU_BLOCK_SIZE, "sha256", "vllm-none-hash").keys(prompt) != ours
