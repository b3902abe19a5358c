"""The copy of vLLM's block hashing (``vllm_adapter/block_hashing.py``) against
vLLM's own functions: the same bytes for the same input, per algorithm."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils

from deployments.vllm_adapter import block_hashing
from tests.support.imports import heavy_modules_after

HAS_XXHASH = importlib.util.find_spec("xxhash") is not None
ALGOS = [
    "sha256",
    "sha256_cbor",
    *(
        pytest.param(algo, marks=pytest.mark.skipif(not HAS_XXHASH, reason="xxhash not installed"))
        for algo in ("xxhash", "xxhash_cbor")
    ),
]
# What vLLM hashes: (parent hash, block tokens, extra keys), the root seed string.
INPUTS: list[Any] = [
    "vLLM-default-seed",
    (b"\x00" * 32, tuple(range(16)), None),
    (b"\x01" * 16, (7, 2**40, 0), (("cache_salt", "tenant-a"),)),
]


@pytest.mark.parametrize("algo", ALGOS)
def test_each_hash_function_is_vllms(algo: str) -> None:
    ours, theirs = block_hashing.hash_fn_by_name(algo), get_hash_fn_by_name(algo)
    assert ours.__name__ == theirs.__name__ == algo
    for value in INPUTS:
        assert ours(value) == theirs(value), (algo, value)


def test_an_unknown_algorithm_is_refused_as_vllm_refuses_it() -> None:
    with pytest.raises(ValueError, match="Unsupported hash function: md5"):
        block_hashing.hash_fn_by_name("md5")
    with pytest.raises(ValueError, match="Unsupported hash function: md5"):
        get_hash_fn_by_name("md5")


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_the_chain_is_vllms_chain(algo: str) -> None:
    """From the root vLLM derives from the seed, each block on its parent, the salt
    on the first block, as an engine chains them."""
    theirs = get_hash_fn_by_name(algo)
    seed = "vLLM-default-seed"
    tokens = list(range(48))
    salt = (("cache_salt", "s"),)
    blocks = [(tokens[:16], salt), (tokens[16:32], None), (tokens[32:], None)]
    chain = block_hashing.hash_chain(block_hashing.hash_fn_by_name(algo), blocks, seed)
    parent = kv_cache_utils.BlockHash(theirs(seed))
    for (block, extra), ours in zip(blocks, chain, strict=True):
        parent = kv_cache_utils.hash_block_tokens(theirs, parent, block, extra)
        assert ours == parent


def test_the_copy_imports_no_vllm() -> None:
    code = (
        "from deployments.routing import prefix_router, block_keys\n"
        "block_keys.BlockKeying(16, 'sha256_cbor', 's').keys(list(range(64)))"
    )
    assert heavy_modules_after(code) == []
