"""Awaiting several tier calls at once, all or none."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TypeVar

T = TypeVar("T")


async def all_or_none(awaitables: Iterable[Awaitable[T]]) -> list[T]:
    """Every result, in order, awaited concurrently; if one fails (or this is
    cancelled), the others are cancelled before the error goes on, so none is left
    running: each prompt of a batch holds an engine request."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
