"""Derender deployment: the CPU text tier, autoscaled on its own.

Stateful streams: a replica takes a rendered request, calls Generate through a
streamed DeploymentHandle (``output_mode: tokens``) and runs the chunks through
the stream derenderer, whose parser and detokenizer live in this replica for
the stream's whole life. Cancelling the caller cancels the generate call.

Stateless endpoints: vLLM's ``/v1/chat/completions/derender`` and
``/v1/completions/derender`` (batch, and per-chunk with ``stream_state``),
answered by vLLM's own ``ServingDerender`` as ``vllm launch render`` does.

What the Ingress calls takes the body or the rendered job as the Ingress
passed it on, validates it here, and answers with ``Reply`` values, not vLLM's
models (``edge/replies.py``): the Ingress imports no vLLM.

Its Serve options, and the import path Serve loads this class by, are declared
in ``deployments/declarations/derender.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from pydantic import TypeAdapter
from ray import serve
from ray.serve.handle import DeploymentHandle
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionResponse,
)
from vllm.entrypoints.openai.completion.protocol import CompletionResponse
from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
    DerenderChatRequestUnion,
    DerenderChatStreamRequest,
    DerenderChatStreamResponse,
    DerenderCompletionRequestUnion,
    DerenderCompletionStreamRequest,
    DerenderCompletionStreamResponse,
    GenerateRequest,
    GenerateTokensResponse,
)
from vllm.entrypoints.serve.engine.protocol import ErrorResponse

from deployments.config.graph_config import GraphConfig
from deployments.edge.bodies import json_of
from deployments.edge.errors import Refusal, bad_request, no_live_replica
from deployments.edge.replies import answers_ingress, ingress_items
from deployments.edge.validation import named_by_header, validate
from deployments.messages.control import ControlCommand, HostLoad
from deployments.messages.replies import RenderedText, served_by
from deployments.messages.tier import (
    ParseContext,
    TextJob,
    moved_key,
    prompt_key,
)
from deployments.observability.metrics import CpuPerToken, Gaps, configure_metrics
from deployments.observability.tracing import (
    Carrier,
    configure_tracing,
    span_attributes,
    trace_kwargs,
    traced_stream,
)
from deployments.render import build_render_state
from deployments.routing.pinned_router import avoiding
from deployments.scaling.cpu_load import CpuLoad
from deployments.scaling.host_load import HostSampler
from deployments.text.derender_output import derender_event, derender_response
from deployments.text.output import ChunkEvent, TextOutput, openai_event, tokens_request
from deployments.transport.channel_reader import StepChannels
from deployments.transport.channel_source import ChannelSource
from deployments.transport.control_channel import CONTROL_SUBSCRIBE_TIMEOUT_S, ControlChannel
from deployments.transport.leaving import LeaveWatch
from deployments.transport.migration import migrating
from deployments.transport.replica_assignment import wait_routed
from deployments.transport.replica_loss import ReplicaLeavingError
from deployments.transport.request_channel import Inboxes, RequestChannelSink
from deployments.transport.serve_internals import (
    drop_access_log_lines,
    on_this_process_data_plane,
    serve_request_id,
)
from deployments.transport.step_channel import Outboxes
from deployments.vllm_adapter.internals import client_request_id

logger = logging.getLogger("ray.serve")
# How often a replica looks whether Serve is stopping it.
LEAVE_WATCH_S = 1.0
_DERENDER_CHAT = TypeAdapter(DerenderChatRequestUnion)
_DERENDER_COMPLETION = TypeAdapter(DerenderCompletionRequestUnion)


class Derender(ChannelSource, RequestChannelSink):
    async def __init__(  # type: ignore[misc]
        self, config: GraphConfig, generate: DeploymentHandle, control: DeploymentHandle
    ) -> None:
        generate, control = (on_this_process_data_plane(h) for h in (generate, control))
        configure_metrics(config.observability.metrics)
        configure_tracing(config.observability.otlp_traces_endpoint, "Derender")
        if config.observability.access_log != "all":  # the Ingress's line per request only
            drop_access_log_lines()
        self._config = config
        self._coalesce_s = config.stream_coalesce_ms / 1000
        self._load = CpuLoad()
        self._cpu_per_token = CpuPerToken()
        self._state = await build_render_state(config)
        self._text = TextOutput(self._state.online_derenderer, self._state.serving_derender)
        self._generate = generate.options(stream=True)
        context = serve.get_replica_context()
        replica = self._replica = context.replica_id.unique_id
        # Its requests to Generate, on channels the Generate replicas open back.
        self._inboxes = Inboxes(replica)
        reply_to = (context.app_name, context.deployment) if config.request_channels else None
        self._generate_channels = StepChannels(generate, replica, self._inboxes, reply_to)
        self._on_unsent = self._generate_channels.on_unsent
        # The Ingress's step channels to this replica.
        self._outboxes = Outboxes(replica)
        self._leave_watch = LeaveWatch(self._outboxes, ends=[self._inboxes])
        self._watch = asyncio.create_task(self._watch_leaving())
        # Request ids of the stateful streams this replica holds right now.
        self._streams: dict[str, int] = {}
        self._host = HostSampler("derender", replica)  # for text_placement: auto
        self._control = ControlChannel(control, "derender", replica, self._on_control)
        await self._control.start(timeout_s=CONTROL_SUBSCRIBE_TIMEOUT_S)

    async def _watch_leaving(self) -> None:
        """A replica Serve stops (the tier scaled in, a redeploy) takes no new streams
        and finishes those it holds, which its ``graceful_shutdown_timeout_s`` covers
        (their text state is here); then its step channels end, so Serve need not
        wait for them. Each pass also adds the tokens a burst's last stream left to the
        CPU-per-token counters."""
        while True:
            self._cpu_per_token.tick()
            if self._leave_watch.poll(busy=self._outboxes.bound > 0):
                logger.warning(
                    "replica %s is being stopped: finishing its %d streams, taking no more",
                    self._replica, self._outboxes.bound,
                )  # fmt: skip
            await asyncio.sleep(LEAVE_WATCH_S)

    def _refuse_if_leaving(self) -> None:
        """Before a call's first item: the Ingress then calls another replica."""
        if self._leave_watch.leaving:
            raise ReplicaLeavingError(self._replica)

    async def _generate_events(
        self, request: GenerateRequest, key: str, trace: Carrier | None
    ) -> AsyncGenerator[Any, None]:
        """Generate's items for ``request``, which go on on another replica if the
        one that took it is lost (``transport/migration.py``); ``trace``: the context
        of the span they are made for."""
        moves = itertools.count()
        traced = trace_kwargs(trace)
        items = migrating(
            lambda current, avoid: self._generate_call(current, key, avoid, next(moves), traced),
            request,
            self._config.generate.migration_limit,
        )
        async with contextlib.aclosing(items) as moving:
            async for item in moving:
                yield item

    async def _generate_call(
        self,
        request: GenerateRequest,
        key: str,
        avoid: tuple[str, ...],
        move: int = 0,
        traced: dict[str, Any] | None = None,
    ) -> AsyncGenerator[Any, None]:
        """One Generate call for ``request``, on a replica not in ``avoid``: a
        stream's events arrive on this replica's step channel to the Generate
        replica that took it. The call is cancelled if we stop early; it carries
        the caller's ``key``, by which the caller ends it should this replica die.
        ``move``: how many times the stream moved before (``transport/migration.py``)."""
        call = self._generate_channels.call(
            "generate_on_channel",
            request,
            key=moved_key(key, move),
            **avoiding(avoid),
            **(traced or {}),
        )
        patience_s = self._config.generate.migration_wait_s if move else 0.0
        try:
            if not await wait_routed(call, self._generate, patience_s):
                raise Refusal(no_live_replica("Generate"))
            gaps = Gaps()
            async for item in call:
                gaps.tick()
                yield item
        finally:
            call.cancel()

    async def text_on_channel(
        self, rendered: RenderedText, caller: str, key: str
    ) -> AsyncIterator[Any]:
        """Tier placement: OpenAI chat/completion output for a rendered request,
        a stream's events on the caller's step channel."""
        self._refuse_if_leaving()
        items = self._text_items(rendered.open(), openai_event, key, trace=rendered.trace)
        marked = _prepend(served_by("tier", with_pid=self._config.expose_replica_pid), items)
        async for item in self._outboxes.bind(ingress_items(marked), caller, key):
            yield item

    def _text_items(
        self,
        job: TextJob,
        event: ChunkEvent,
        key: str,
        role_chunk: bool = True,
        trace: Carrier | None = None,
    ) -> AsyncGenerator[Any, None]:
        """The job's output, each stream chunk written by ``event`` (not coalesced:
        the step channel batches it); ``role_chunk`` as ``TextOutput.stream``; in a
        ``derender`` span under ``trace`` (the caller's)."""
        attributes = span_attributes(
            job.generate_request.request_id, serve_request_id, placement="tier"
        )
        return traced_stream(
            "derender",
            trace,
            attributes,
            lambda carrier: self._job_items(job, event, key, role_chunk, carrier),
        )

    async def _job_items(
        self,
        job: TextJob,
        event: ChunkEvent,
        key: str,
        role_chunk: bool,
        trace: Carrier | None,
    ) -> AsyncGenerator[Any, None]:
        stream = bool(job.generate_request.stream)
        stream_id = job.generate_request.request_id
        self._streams[stream_id] = self._streams.get(stream_id, 0) + 1
        if job.batch is None:
            sources = [self._generate_events(tokens_request(job, stream=stream), key, trace)]
        else:  # one Generate call per prompt, each routed on its own, as vLLM's batch
            sources = [
                self._generate_events(
                    tokens_request(job, stream=stream, prompt=prompt), prompt_key(key, i), trace
                )
                for i, prompt in enumerate(job.batch)
            ]
        try:
            # A batch's prompts are called in turn, each once the one before has
            # answered its first item (a unary prompt: its whole answer); then their
            # streams run at once. Calls made for one request before the one before
            # had answered were seen to hang, the later never reaching Generate.
            firsts = [await anext(source) for source in sources]
            results = [
                first
                if isinstance(first, (ErrorResponse, GenerateTokensResponse))
                else _prepend(first, source)
                for first, source in zip(firsts, sources, strict=True)
            ]
            if job.batch is None:
                answer = self._text.respond(
                    job, results[0], event, role_chunk, tap=self._count_tokens
                )
            else:
                answer = self._text.respond_batch(job, results, event)
            async with contextlib.aclosing(answer) as items:
                async for item in items:
                    yield item
        finally:
            for source in sources:
                await source.aclose()
            if self._streams.get(stream_id, 0) <= 1:
                self._streams.pop(stream_id, None)
            else:
                self._streams[stream_id] -= 1

    def _count_tokens(self, payload: dict[str, Any]) -> None:
        """A ``PayloadTap``: the tokens of each generate payload derendered here."""
        tokens = sum(len(c.get("token_ids") or ()) for c in payload.get("choices") or ())
        self._load.did(tokens)
        self._cpu_per_token.did(tokens)

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's autoscaler asks: cores used, tokens derendered per second
        (``scaling/cpu_load.py``)."""
        return self._load.report()

    async def _on_control(self, command: ControlCommand) -> int | HostLoad | None:
        if command.kind == "host_load":
            return self._host.reading()
        return self._holds(command.request_ids) if command.kind == "abort" else None

    def _holds(self, request_ids: list[str]) -> int:
        """How many of these requests have a stateful stream in this replica.

        The abort itself happens in the engine; its final ``abort`` chunk
        reaches the client through the stream held here.
        """
        wanted = {client_request_id(i) for i in request_ids}
        return sum(1 for i in wanted if i in self._streams)

    def __del__(self) -> None:
        watch = getattr(self, "_watch", None)
        if watch is not None:
            watch.cancel()
        control = getattr(self, "_control", None)
        if control is not None:
            control.stop()
        channels = getattr(self, "_generate_channels", None)
        if channels is not None:
            channels.stop()

    async def generate_derender_on_channel(
        self,
        body: dict[str, Any],
        context: Any,
        header_id: str | None,
        caller: str,
        key: str,
        trace: Carrier | None = None,
    ) -> AsyncIterator[Any]:
        """``output_mode: "derender"``: the parsed assistant message, unary or
        streamed, a stream's events on the caller's step channel. ``body`` is the
        generate body, ``context`` its ``parse_context``, as the client sent them,
        ``header_id`` its ``X-Request-Id``; ``trace``, the Ingress's span."""
        self._refuse_if_leaving()
        named = named_by_header(body, header_id)
        items = ingress_items(self._derender_items(named, context, key, trace))
        async for item in self._outboxes.bind(items, caller, key):
            yield item

    async def _derender_items(
        self, body: dict[str, Any], context: Any, key: str, trace: Carrier | None
    ) -> AsyncGenerator[Any, None]:
        request = validate({**body, "output_mode": "tokens"}, GenerateRequest)
        if not request.sampling_params.detokenize:
            raise Refusal(bad_request("output_mode='derender' requires sampling_params.detokenize"))
        parse_context = None if context is None else validate(context, ParseContext)
        model = request.model or self._config.model_name
        chat = (parse_context or ParseContext()).chat_request(model)
        # Each choice carries its token ids, as vLLM's chat does when asked (its logprobs
        # come whenever the generate request asks the engine for them).
        chat.return_token_ids = True
        job = TextJob(generate_request=request, chat_request=chat, model_name=model)
        texts = self._text_items(job, derender_event, key, role_chunk=False, trace=trace)
        async with contextlib.aclosing(texts) as items:
            async for item in items:
                yield derender_response(item) if isinstance(item, ChatCompletionResponse) else item

    @answers_ingress
    async def derender_chat(
        self, body: bytes
    ) -> ChatCompletionResponse | DerenderChatStreamResponse | ErrorResponse:
        """vLLM's ``/v1/chat/completions/derender``, the body as the client sent it."""
        request = validate(json_of(body), _DERENDER_CHAT)
        serving = self._state.serving_derender
        if isinstance(request, DerenderChatStreamRequest):
            result = await serving.derender_chat_stream_response(request)
            return _with_state(result, DerenderChatStreamResponse)
        return await serving.derender_chat_response(request)

    @answers_ingress
    async def derender_completion(
        self, body: bytes
    ) -> CompletionResponse | DerenderCompletionStreamResponse | ErrorResponse:
        """vLLM's ``/v1/completions/derender``, the body as the client sent it."""
        request = validate(json_of(body), _DERENDER_COMPLETION)
        serving = self._state.serving_derender
        if isinstance(request, DerenderCompletionStreamRequest):
            result = await serving.derender_completion_stream_response(request)
            return _with_state(result, DerenderCompletionStreamResponse)
        return await serving.derender_completion_response(request)


def _with_state(result: Any, wrapper: Any) -> Any:
    """vLLM's ``(chunk, stream_state)`` pair → its per-chunk response model."""
    if isinstance(result, ErrorResponse):
        return result
    chunk, state = result
    return wrapper(chunk=chunk, stream_state=state)


async def _prepend(first: Any, rest: AsyncGenerator[Any, None]) -> AsyncGenerator[Any, None]:
    """``first``, then ``rest``, which closes with this generator."""
    yield first
    async with contextlib.aclosing(rest) as items:
        async for item in items:
            yield item
