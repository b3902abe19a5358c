"""vLLM 0.32's prefix-cache block hashing, copied, so that the prefix router
imports no vLLM.

The router runs in every caller of Generate, the Ingress among them, and the
Ingress imports no vLLM. vLLM's own functions live in ``vllm/utils/hashing.py``
and ``vllm/v1/core/kv_cache_utils.py``, which are light, but importing either
runs ``vllm/__init__`` and its ``env_override``, which imports torch: ~5 s of
CPU and ~0.4 GB, in the middle of the first request routed. So the four hash
functions and the chain step are copied here, with vLLM's names.
``tests/unit/vllm_adapter/test_block_hashing.py`` holds each to vLLM's own, as
``test_internals.py`` holds the symbols reached through ``internals.py``.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Sequence
from typing import Any


def sha256(input: Any) -> bytes:
    """``vllm.utils.hashing.sha256``: SHA-256 of the pickled input."""
    return hashlib.sha256(pickle.dumps(input, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def sha256_cbor(input: Any) -> bytes:
    """``vllm.utils.hashing.sha256_cbor``: SHA-256 of canonical CBOR (vLLM's default)."""
    import cbor2

    return hashlib.sha256(cbor2.dumps(input, canonical=True)).digest()


def _xxh3_128(input_bytes: bytes) -> bytes:
    try:
        import xxhash as _xxhash
    except ImportError:
        raise ModuleNotFoundError(
            "xxhash is required for the 'xxhash' prefix caching hash algorithms. "
            "Install it via `pip install xxhash`."
        ) from None
    digest: bytes = _xxhash.xxh3_128_digest(input_bytes)
    return digest


def xxhash(input: Any) -> bytes:
    """``vllm.utils.hashing.xxhash``: xxHash3-128 of the pickled input."""
    return _xxh3_128(pickle.dumps(input, protocol=pickle.HIGHEST_PROTOCOL))


def xxhash_cbor(input: Any) -> bytes:
    """``vllm.utils.hashing.xxhash_cbor``: xxHash3-128 of canonical CBOR."""
    import cbor2

    return _xxh3_128(cbor2.dumps(input, canonical=True))


HASH_FUNCTIONS: dict[str, Callable[[Any], bytes]] = {
    "sha256": sha256,
    "sha256_cbor": sha256_cbor,
    "xxhash": xxhash,
    "xxhash_cbor": xxhash_cbor,
}
"""``vllm.utils.hashing.get_hash_fn_by_name``, as a table."""


def hash_fn_by_name(algo: str) -> Callable[[Any], bytes]:
    """vLLM's block hash function named by ``--prefix-caching-hash-algo``."""
    if algo not in HASH_FUNCTIONS:
        raise ValueError(f"Unsupported hash function: {algo}")
    return HASH_FUNCTIONS[algo]


def hash_block_tokens(
    hash_function: Callable[[Any], bytes],
    parent_block_hash: bytes,
    curr_block_token_ids: Sequence[int],
    extra_keys: tuple[Any, ...] | None = None,
) -> bytes:
    """``kv_cache_utils.hash_block_tokens``: a block's hash, chained on its parent's
    (here always given: the chain starts from the root ``hash_chain`` derives)."""
    return hash_function((parent_block_hash, tuple(curr_block_token_ids), extra_keys))


def hash_chain(
    hash_fn: Callable[[Any], bytes],
    blocks: Sequence[tuple[Sequence[int], tuple[Any, ...] | None]],
    root_seed: str,
) -> list[bytes]:
    """vLLM's block hashes of ``blocks`` (tokens, extra keys), each chained on the one
    before; the first on the root vLLM derives from ``root_seed``
    (``kv_cache_utils.init_none_hash``: the hash of the seed)."""
    parent = hash_fn(root_seed)
    out: list[bytes] = []
    for token_ids, extra_keys in blocks:
        parent = hash_block_tokens(hash_fn, parent, token_ids, extra_keys)
        out.append(parent)
    return out
