"""vLLM's prefix-cache block keys and KV cache events, in the one shape the router uses.

A vLLM engine with prefix caching names every full block of ``block_size``
tokens by a hash chained over the whole prefix up to it: the parent's hash,
the block's tokens, and extra keys (``cache_salt`` on the first block, LoRA).
The chain starts from ``NONE_HASH``, derived from ``PYTHONHASHSEED`` if set,
else from vLLM's fixed default seed (for the cryptographic algorithms; the
non-cryptographic ones get a random seed per process, which nobody outside
the engine can reproduce). KV cache events (``--kv-events-config``) publish
the hashes of blocks stored and removed, as 64-bit ints by default
(``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``).

The router computes the same keys from a request's rendered token ids with
vLLM's hash functions, and compares them with what each engine's events say
it holds. vLLM's hashing is copied in ``vllm_adapter/block_hashing.py`` (the
router runs in the Ingress, which imports no vLLM) and held to vLLM's by a
test; its event types are vLLM's public KV events API.
``tests/integration/test_kv_block_keys.py`` checks its keys against the events
of vLLM's own server.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from deployments.vllm_adapter.block_hashing import hash_chain, hash_fn_by_name

_INT_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class BlockKeying:
    """How one engine names its blocks: all a router needs to name them the same way."""

    block_size: int
    hash_algo: str
    seed: str

    def keys(self, token_ids: Sequence[int], cache_salt: str | None = None) -> list[int]:
        """The engine's keys (as KV events carry them) of every full block of ``token_ids``."""
        size = self.block_size
        blocks = [
            # vLLM's extra keys without LoRA or multimodal input: the salt, on block 0.
            (
                token_ids[start : start + size],
                (("cache_salt", cache_salt),) if start == 0 and cache_salt else None,
            )
            for start in range(0, len(token_ids) - size + 1, size)
        ]
        return [event_key(h) for h in hash_chain(_hash_fn(self.hash_algo), blocks, self.seed)]


def event_key(block_hash: bytes | int) -> int:
    """A block hash as an int, as vLLM's KV events carry it by default."""
    if isinstance(block_hash, int):
        return block_hash
    return int.from_bytes(block_hash, byteorder="big") & _INT_MASK


def engine_keying(vllm_config: Any, env: dict[str, str] | None = None) -> BlockKeying | None:
    """The keying of an engine built from ``vllm_config`` in a process with ``env``.

    None when a router cannot reproduce it: prefix caching off, or a
    non-cryptographic hash without ``PYTHONHASHSEED`` (a random root per engine).
    """
    cache = vllm_config.cache_config
    if not cache.enable_prefix_caching:
        return None
    env = dict(os.environ) if env is None else env
    seed = env.get("PYTHONHASHSEED")
    algo = str(cache.prefix_caching_hash_algo)
    if seed is None:
        from deployments.vllm_adapter.internals import NON_CRYPTO_HASH_ALGOS, default_none_hash_seed

        if algo in NON_CRYPTO_HASH_ALGOS:
            return None
        seed = default_none_hash_seed()
    return BlockKeying(block_size=int(cache.block_size), hash_algo=algo, seed=seed)


def kv_events_config(endpoint: str) -> dict[str, Any]:
    """``--kv-events-config`` for an engine that publishes its block events on ``endpoint``."""
    return {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint}


@dataclass(frozen=True)
class BlockEvents:
    """One published batch of an engine's KV events, as block keys."""

    stored: list[int]
    removed: list[int]
    cleared: bool
    """The engine dropped every block (a prefix cache reset) before ``stored``."""


def decode_events(payload: bytes) -> list[BlockEvents]:
    """vLLM's msgpack ``KVEventBatch`` (the ZMQ payload frame) → block keys, in order."""
    from vllm.distributed.kv_events import (
        AllBlocksCleared,
        BlockRemoved,
        BlockStored,
        KVEventBatch,
    )

    batch = _decoder(KVEventBatch).decode(payload)
    out: list[BlockEvents] = []
    for event in batch.events:
        if isinstance(event, BlockStored):
            out.append(BlockEvents([event_key(h) for h in event.block_hashes], [], False))
        elif isinstance(event, BlockRemoved):
            out.append(BlockEvents([], [event_key(h) for h in event.block_hashes], False))
        elif isinstance(event, AllBlocksCleared):
            out.append(BlockEvents([], [], True))
    return out


_DECODERS: dict[type, Any] = {}
_HASH_FNS: dict[str, Callable[[Any], bytes]] = {}


def _decoder(kind: type) -> Any:
    if kind not in _DECODERS:
        import msgspec

        _DECODERS[kind] = msgspec.msgpack.Decoder(type=kind)
    return _DECODERS[kind]


def _hash_fn(algo: str) -> Callable[[Any], bytes]:
    if algo not in _HASH_FNS:
        _HASH_FNS[algo] = hash_fn_by_name(algo)
    return _HASH_FNS[algo]
