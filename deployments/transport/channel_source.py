"""A deployment whose callers read its streams on step channels (``step_channel.py``)
and may send it their requests on request channels (``request_channel.py``).

A caller that opens a step channel here names itself (``reply_to``: its
application and deployment); this replica then opens the way back, a
``request_channel`` call pinned to that caller replica, and runs each request it
brings as the caller's handle call would have run: the same ``*_on_channel``
method, its items put on the caller's step channel.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.transport.request_channel import RequestReader, Start
from deployments.transport.serve_internals import on_this_process_data_plane
from deployments.transport.step_channel import Outboxes

# Where a caller replica's requests come back from: (application, deployment).
ReplyTo = tuple[str, str]
# A method a request channel may run: what the per-request handle calls run.
_RUNNABLE_SUFFIX = "_on_channel"


class ChannelSource:
    """Keeps an ``Outboxes``, a window, and a request reader per caller replica that
    named itself; serves the ``step_channel`` call."""

    _outboxes: Outboxes
    _coalesce_s: float
    _replica: str
    # The most requests this replica runs at once (Serve's max_ongoing_requests, less
    # a slot per channel): past it, a request on a channel is refused (``Refused``)
    # and its caller makes it a handle call, which Serve's router queues.
    _requests_max: int = 0

    async def step_channel(
        self, caller: str, replica: str, reply_to: ReplyTo | None = None
    ) -> AsyncIterator[Any]:
        """The caller's step channel: its bound streams' events, one item per
        wake-up (``PinnedRouter`` routes the call here by ``replica``); with
        ``reply_to``, its requests come here on a request channel while it is open."""
        reader = None
        if reply_to is not None and self._requests_max > 0 and replica == self._replica:
            reader = self._read_requests(caller, reply_to)
        try:
            async for batch in self._outboxes.drain(caller, replica, self._coalesce_s):
                yield batch
        finally:
            if reader is not None:
                reader.stop()
                if self._request_readers.get(caller) is reader:
                    del self._request_readers[caller]

    @property
    def _request_readers(self) -> dict[str, RequestReader]:
        readers: dict[str, RequestReader] | None = self.__dict__.get("_readers")
        if readers is None:
            readers = self.__dict__["_readers"] = {}
        return readers

    def channel_requests(self) -> int:
        """Requests running here that came on request channels."""
        return sum(len(reader.running) for reader in self._request_readers.values())

    def _admits(self) -> bool:
        readers = self._request_readers.values()
        on_channels = sum(len(r.running) for r in readers)
        bound_by_them = sum(r.bound for r in readers)
        calls = self._outboxes.bound - bound_by_them  # streams that came as handle calls
        return on_channels + calls < self._requests_max - self._outboxes.open_channels

    def _read_requests(self, caller: str, reply_to: ReplyTo) -> RequestReader:
        old = self._request_readers.pop(caller, None)
        if old is not None:
            old.stop()
        app, deployment = reply_to
        handle: DeploymentHandle[Any] = on_this_process_data_plane(
            serve.get_deployment_handle(deployment, app)
        ).options(stream=True)
        reader = RequestReader(
            lambda: handle.request_channel.remote(self._replica, replica=caller),
            caller,
            self._run_request,
            lambda key, item, urgent: self._outboxes.get(caller).put(key, item, urgent),
            self._admits,
        )
        self._request_readers[caller] = reader
        return reader

    def _run_request(self, message: Start, caller: str) -> AsyncIterator[Any]:
        if not message.method.endswith(_RUNNABLE_SUFFIX):
            raise ValueError(f"{message.method} is not a request a channel may run")
        method = getattr(self, message.method)
        result: AsyncIterator[Any] = method(*message.args, caller, message.key, **message.kwargs)
        return result
