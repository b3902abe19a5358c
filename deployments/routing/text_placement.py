"""``text_placement: auto``: where each request's text is made, from measured load.

It sends a *share* of the requests worth moving to the Derender tier and keeps
the rest inline. The Ingress reads every Generate and Derender replica's host load
(``scaling/host_load.py``) each ``refresh_s`` while auto-placed requests come, and
moves the share by ``step``:

- to 0 at once when no Derender replica has CPUs of its own (same machine, CPUs shared
  with a Generate replica): the tier's work would land on the engine's cores, plus a hop;
- up while Generate is under pressure (``busy``) and more so than the tier (``margin``);
- down while Generate is idle (``idle``) or the tier is the busier by ``margin``;
- held in between, so a placement that itself moves the load does not flap.

Pressure is the busier of a replica's host CPUs and its event loop: on a GPU host the
engine's one core leaves many idle while the replica's one Python thread is full.
A request worth moving is one whose text work pays for the hop: long enough for its
kind (parsed or not, ``min_tokens``). Within the share, requests go to the tier in turn
(error diffusion), so the split holds at any arrival pattern.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from statistics import fmean

from deployments.config.placement import AutoPlacementConfig
from deployments.messages.control import HostLoad
from deployments.messages.replies import RenderedText

logger = logging.getLogger("ray.serve")


@dataclass(frozen=True)
class Pressure:
    """One reading of both tiers, as the share moves on it."""

    generate: float
    derender: float
    own_cpus: bool
    """Whether some Derender replica runs on CPUs no Generate replica runs on."""


def pressure(loads: list[HostLoad]) -> Pressure | None:
    """Both tiers' mean pressure; None unless each tier gave a reading."""
    generate = [load for load in loads if load.tier == "generate"]
    derender = [load for load in loads if load.tier == "derender"]
    if not generate or not derender:
        return None
    engine_cpus = {(load.host, cpu) for load in generate for cpu in load.cpus}
    own = any(all((d.host, cpu) not in engine_cpus for cpu in d.cpus) for d in derender)
    return Pressure(
        generate=fmean(max(load.host_busy, load.loop_busy) for load in generate),
        derender=fmean(max(load.host_busy, load.loop_busy) for load in derender),
        own_cpus=own,
    )


class AutoPlacement:
    """The share of movable requests sent to the tier, and each request's placement."""

    def __init__(self, settings: AutoPlacementConfig, *, tokens_only: bool = False) -> None:
        self._settings = settings
        self._tokens_only = tokens_only
        self.share = 0.0
        self.last: Pressure | None = None
        self._credit = 0.0

    def observe(self, loads: list[HostLoad]) -> None:
        """Move the share on one reading of every replica."""
        now = pressure(loads)
        if now is None:
            return  # a tier with no reading yet: hold
        self.last = now
        s = self._settings
        if not now.own_cpus:
            self.share = 0.0
        elif now.generate >= s.busy and now.generate - now.derender >= s.margin:
            self.share = min(1.0, self.share + s.step)
        elif now.generate < s.idle or now.derender - now.generate >= s.margin:
            self.share = max(0.0, self.share - s.step)

    def choose(self, rendered: RenderedText) -> tuple[str, str]:
        """(placement, why) for one request."""
        if self._tokens_only:
            return "tier", "tokens-only"
        s = self._settings
        least = s.min_tokens_parsed if rendered.parsed else s.min_tokens
        if rendered.expected_tokens is not None and rendered.expected_tokens < least:
            return "inline", "short"
        if self.last is not None and not self.last.own_cpus:
            return "inline", "shared-cpus"
        self._credit += self.share
        if self._credit >= 1.0:
            self._credit -= 1.0
            return "tier", f"share={self.share:.2f}"
        return "inline", f"share={self.share:.2f}"


class PlacementReader:
    """Reads the replicas' host loads into an :class:`AutoPlacement` while auto-placed
    requests come; stops ``idle_stop_s`` after the last one, so an idle graph calls nothing."""

    def __init__(
        self,
        placement: AutoPlacement,
        read: Callable[[], Awaitable[list[HostLoad]]],
        settings: AutoPlacementConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._placement, self._read, self._settings, self._clock = (
            placement,
            read,
            settings,
            clock,
        )
        self._last_request = -float("inf")
        self._task: asyncio.Task[None] | None = None

    def touch(self) -> None:
        """An auto-placed request came: keep reading (start again if stopped)."""
        self._last_request = self._clock()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while self._clock() - self._last_request < self._settings.idle_stop_s:
            try:
                self._placement.observe(await self._read())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the control plane restarting: hold the share
                logger.warning("auto placement: host loads not read: %r", exc)
            await asyncio.sleep(self._settings.refresh_s)
