"""The Ingress's streamed calls for text and tokens: where a rendered request's text is
made (inline on a Generate replica, or on the Derender tier), and ``/inference/v1/generate``
by its ``output_mode``; each answered by ``tier_calls.respond``.

Every stream rides a step channel (``transport/step_channel.py``) to the replica that
took it. An inline stream or a Generate call can move to another Generate replica when
its engine is lost (``transport/migrating_call.py``); a tier stream whose Derender
replica dies has its Generate call ended through the control plane.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

from fastapi.responses import Response
from ray.serve.handle import DeploymentHandle

from deployments.config.graph_config import GraphConfig
from deployments.edge.placement import AUTO_REASON_HEADER, PLACEMENT_HEADER
from deployments.edge.tier_calls import call, openai_stream_error, respond
from deployments.messages.control import HostLoad
from deployments.messages.replies import RenderedText, Reply
from deployments.messages.text_steps import TextResume
from deployments.observability.metrics import graph_metrics
from deployments.observability.tracing import request_trace_kwargs
from deployments.routing.pinned_router import avoiding
from deployments.routing.text_placement import AutoPlacement, PlacementReader
from deployments.transport.channel_reader import ChannelStream, StepChannels
from deployments.transport.migrating_call import MigratingCall
from deployments.transport.migration import DeliveredText

Avoid = tuple[str, ...]


class TextCalls:
    """One Ingress replica's text and token streams into Generate and Derender."""

    def __init__(
        self,
        config: GraphConfig,
        generate: DeploymentHandle,
        derender: DeploymentHandle,
        control_plane: DeploymentHandle,
        replica: str,
    ) -> None:
        self._config = config
        self._control = control_plane
        self._generate = generate.options(stream=True)
        self._generate_channels = StepChannels(generate, replica)
        self._derender = derender.options(stream=True)
        self._derender_channels = StepChannels(derender, replica)
        self._auto = AutoPlacement(config.auto_placement, tokens_only=config.tokens_only)
        self._auto_reader = PlacementReader(self._auto, self._host_loads, config.auto_placement)
        # Abort calls in flight after a tier failed (held so they are not collected).
        self._cleanups: set[asyncio.Task[Any]] = set()

    async def text(
        self,
        rendered: RenderedText,
        placement: str,
        stream_error: Callable[[Reply], list[str]] = openai_stream_error,
    ) -> Response:
        """``rendered``'s text where ``placement`` (the request's or the graph's) puts
        it; ``auto`` chooses by the hosts' load (``routing/text_placement.py``)."""
        headers = {}
        reason = "requested"  # by the header, or the graph's text_placement
        if rendered.beside_engine:
            placement, reason = "inline", "beside_engine"
        elif placement == "auto":
            self._auto_reader.touch()
            placement, headers[AUTO_REASON_HEADER] = self._auto.choose(rendered)
            reason = headers[AUTO_REASON_HEADER].split("=", 1)[0]
        headers[PLACEMENT_HEADER] = placement
        graph_metrics().text_placements.inc(tags={"placement": placement, "reason": reason})
        if placement == "inline":

            def text(request: tuple[RenderedText, TextResume | None], avoid: Avoid) -> Any:
                return self._generate_channels.call("text_on_channel", *request, **avoiding(avoid))

            generate = self._config.generate
            return await respond(
                lambda avoid: MigratingCall(
                    text,
                    (rendered, None),
                    generate.migration_limit,
                    self._generate,
                    avoid,
                    generate.migration_wait_s,
                    DeliveredText(rendered),
                ),
                self._generate,
                headers,
                stream_error=stream_error,
            )
        return await respond(
            lambda _: self._derender_channels.call("text_on_channel", rendered),
            self._derender,
            headers,
            on_failure=self._end_later,
            stream_error=stream_error,
        )

    async def generate(
        self, data: dict[str, Any], context_data: Any, header_id: str | None
    ) -> Response:
        """``/inference/v1/generate``'s body (without its ``parse_context``,
        ``context_data``): ``tokens`` and ``text`` on Generate, ``derender`` on the
        Derender tier, each of which validates it."""
        if data.get("output_mode") == "derender":
            return await respond(
                lambda _: self._derender_channels.call(
                    "generate_derender_on_channel",
                    data,
                    context_data,
                    header_id,
                    **request_trace_kwargs(),
                ),
                self._derender,
                on_failure=self._end_later,
            )
        # Named here as Generate would name it (edge.validation.named_by_header, else
        # vLLM's random id), so that a moved stream keeps its id.
        if "request_id" not in data:
            data["request_id"] = header_id or uuid.uuid4().hex
        traced = request_trace_kwargs()

        def generate(body: dict[str, Any], avoid: Avoid) -> Any:
            # The Ingress's own call: ending it (client gone, failure) cancels it there.
            return self._generate_channels.call(
                "generate_body_on_channel", body, header_id, **avoiding(avoid), **traced
            )

        limit = self._config.generate.migration_limit
        move_wait_s = self._config.generate.migration_wait_s
        return await respond(
            lambda avoid: MigratingCall(generate, data, limit, self._generate, avoid, move_wait_s),
            self._generate,
        )

    async def _host_loads(self) -> list[HostLoad]:
        return await call(self._control.host_loads.remote(), self._control)

    def _end_later(self, tier_call: ChannelStream) -> None:
        """End the Generate call made for ``tier_call``, in the background.

        A Derender replica that dies mid-stream cannot cancel its call to
        Generate, and Ray does not cancel an actor call whose caller died:
        the engine would run the request to its end for nobody. The call is
        named by its key, a uuid no client sees, not by the request id: another
        client's request may carry the same one.
        """
        ending = self._control.end_calls.remote([tier_call.key])
        task = asyncio.create_task(call(ending, self._control))
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)
