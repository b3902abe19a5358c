"""Generate deployment: a vLLM ``AsyncLLM`` engine in the replica, token in / token out.

A thin router over vLLM's ``ServingTokens`` (``/inference/v1/generate``),
built by vLLM's own ``init_app_state``. Every method is an async generator,
called through a streamed DeploymentHandle: a unary call yields one response,
an error one error value, and a stream its SSE events as vLLM writes them, on
its caller's step channel (``transport/step_channel.py``). What the Ingress
calls (``generate_body_on_channel``, ``text_on_channel``) takes the body or the
rendered job as the Ingress passed it on and yields ``Reply`` values, not
vLLM's models (``edge/replies.py``): the Ingress imports no vLLM.

It also serves the inline text placement: the same stream derenderer as the
Derender tier, next to the engine.

Its Serve options, and the import path Serve loads this class by, are declared
in ``deployments/declarations/generate.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import ray
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.datastructures import State
from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
    GenerateRequest,
    GenerateResponseBase,
)
from vllm.entrypoints.serve.engine.protocol import ErrorResponse

from deployments.config.graph_config import GraphConfig
from deployments.edge.errors import bad_request
from deployments.edge.json_body import allow_deep_values
from deployments.edge.replies import ingress_items
from deployments.edge.validation import named_by_header, validate
from deployments.messages.control import ControlCommand, EngineState, HostLoad
from deployments.messages.replies import RenderedText, served_by
from deployments.messages.text_steps import TextResume
from deployments.observability import tracing
from deployments.observability.metrics import configure_metrics
from deployments.observability.tracing import Carrier
from deployments.routing.block_keys import engine_keying, kv_events_config
from deployments.routing.engine_blocks import (
    CHANNEL_REQUESTS_KEY,
    CHANNELS_KEY,
    KV_USE_KEY,
    ROUTING_STATS_KEY,
    EngineBlocks,
    EventSubscriber,
    events_endpoint,
)
from deployments.scaling.host_load import HostSampler
from deployments.text.inline_text import InlineText, inline_call_movable
from deployments.text.output import TextOutput
from deployments.transport.channel_source import ChannelSource
from deployments.transport.control_channel import CONTROL_SUBSCRIBE_TIMEOUT_S, ControlChannel
from deployments.transport.leaving import LeaveWatch
from deployments.transport.serve_internals import (
    drop_access_log_lines,
    on_this_process_data_plane,
    replica_max_ongoing_requests,
    serve_request_id,
)
from deployments.transport.step_channel import Outboxes
from deployments.vllm_adapter.engine_args import serve_namespace
from deployments.vllm_adapter.engine_calls import EngineCalls
from deployments.vllm_adapter.engine_load import kv_cache_use
from deployments.vllm_adapter.engine_metrics import local_vllm_metrics
from deployments.vllm_adapter.engine_start import (
    CoreClaim,
    claim_cores,
    engine_core_count,
    start_vllm_engine,
    started_on,
)
from deployments.vllm_adapter.engine_streams import abort_held, record_streams
from deployments.vllm_adapter.internals import ENGINE_APP_STATE_NAMES, checked_app_state
from deployments.vllm_adapter.serve_logging import serve_log_kept
from deployments.vllm_adapter.worker_fork import remember_worker_start

# Takes the namespace `vllm serve` would parse (vllm_args.serve_namespace).
EngineFactory = Callable[[argparse.Namespace], Awaitable[Any]]
logger = logging.getLogger("ray.serve")
# How often a replica looks at its engine and whether Serve is stopping it, and how
# long a replica whose engine died lets the error items it already yielded reach
# their callers before it exits.
ENGINE_WATCH_S = 0.2
DEAD_ENGINE_EXIT_GRACE_S = 0.5


class Generate(ChannelSource):
    """One engine per replica."""

    async def __init__(  # type: ignore[misc]
        self,
        config: GraphConfig,
        control: DeploymentHandle,
        engine_factory: EngineFactory = start_vllm_engine,
    ) -> None:
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state

        configure_metrics(config.observability.metrics)
        tracing.configure_tracing(config.observability.otlp_traces_endpoint, "Generate")
        if config.observability.access_log != "all":  # the Ingress's line per request only
            drop_access_log_lines()
        allow_deep_values()  # requests nested as deep as the edge lets through
        self._config = config
        self._coalesce_s = config.stream_coalesce_ms / 1000
        context = serve.get_replica_context()
        self._replica = context.replica_id.unique_id
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
        count = engine_core_count(config.generate.cpu_cores, cpus)
        # Held while the replica lives, so the host's next engine binds elsewhere.
        self._core_claim: CoreClaim | None = None
        cores = None
        if count is not None and config.num_gpus == 0:  # CPU engines only
            self._core_claim = claim_cores(
                list(os.sched_getaffinity(0)), count, context.rank.local_rank
            )
            cores = self._core_claim.cores
            # Read by the engine core process, which this replica is about to spawn.
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))
        # With prefix routing, the engine publishes its KV cache events to this replica,
        # which reports the blocks it holds to every caller's router (kv_index.py).
        prefix = config.generate.routing_policy() == "prefix"
        events = prefix and config.generate.prefix_routing.engine_events
        endpoint = events_endpoint(self._replica) if events else None
        args = serve_namespace(
            config,
            role="generate",
            kv_events=None if endpoint is None else kv_events_config(endpoint),
        )
        remember_worker_start()  # the engine's worker is forked (worker_fork.py)
        with serve_log_kept(), started_on(cores):
            self._engine = await engine_factory(args)
        # Each call's cleanup ends only the engine requests it opened (engine_streams.py).
        record_streams(self._engine)
        self._blocks: EngineBlocks | None = None
        self._events: EventSubscriber | None = None
        keying = engine_keying(self._engine.vllm_config) if prefix else None
        if keying is not None:
            # Without engine events the routers still need the keying; the set stays empty.
            self._blocks = EngineBlocks(keying)
            if endpoint is not None:
                self._events = EventSubscriber(endpoint, self._blocks)
                self._events.start()
        state = State()
        await init_app_state(self._engine, state, args, await self._engine.get_supported_tasks())
        state = checked_app_state(state, ENGINE_APP_STATE_NAMES)
        self._calls = EngineCalls(
            self._engine, state.serving_tokens, self._replica, state.openai_serving_completion
        )
        text = TextOutput(state.online_derenderer, state.serving_derender)
        self._inline = InlineText(text)
        self._outboxes = Outboxes(self._replica)
        if config.request_channels:  # Derender replicas' requests (channel_source.py)
            self._requests_max = replica_max_ongoing_requests()
        self._leave_watch = LeaveWatch(self._outboxes)
        # Aborts and /metrics reach this replica even when its streams fill every slot.
        # The channel runs on this loop, the engine's, so its aborts need no hop.
        self._host = HostSampler("generate", self._replica)  # for text_placement: auto
        self._control = ControlChannel(
            on_this_process_data_plane(control), "generate", self._replica, self._on_control
        )
        await self._control.start(timeout_s=CONTROL_SUBSCRIBE_TIMEOUT_S)
        self._watchdog = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        """A replica without an engine leaves at once, so Serve routes around it and
        starts another, rather than after three failed health checks (~30 s), in
        which every request routed here would fail. Its callers see the actor die
        or its calls raise ``EngineLostError``, and move the streams that can move
        (``transport/migration.py``). A replica Serve is stopping hands its streams
        back the same way (``EngineCalls.leave``)."""
        while not self._engine.errored:
            # Once it leaves, its channels end when no call is left to put events on
            # them: the streams that cannot move finish on them.
            if self._leave_watch.poll(busy=self._calls.busy):
                self._calls.leave()
            await asyncio.sleep(ENGINE_WATCH_S)
        logger.error("engine of replica %s died: exiting so Serve replaces it", self._replica)
        await asyncio.sleep(DEAD_ENGINE_EXIT_GRACE_S)
        os._exit(1)

    async def generate_body_on_channel(
        self,
        body: dict[str, Any],
        header_id: str | None,
        caller: str,
        key: str,
        avoid: tuple[str, ...] = (),
        trace: Carrier | None = None,
    ) -> AsyncIterator[Any]:
        """``/inference/v1/generate`` (``tokens`` and ``text``), the body as the client
        sent it and its ``X-Request-Id``: one reply, or SSE events if ``stream``, on
        the caller's step channel. ``avoid`` is for the router (``PinnedRouter``),
        here as in every method below; ``trace``, the caller's span
        (``observability/tracing.py``)."""
        items = ingress_items(self._generate_body(body, header_id, trace))
        async for item in self._outboxes.bind(items, caller, key):
            yield item

    async def _generate_body(
        self, body: dict[str, Any], header_id: str | None, trace: Carrier | None
    ) -> AsyncGenerator[Any, None]:
        request = validate(named_by_header(body, header_id), GenerateRequest)
        async with contextlib.aclosing(self._generate_items(request, trace=trace)) as answered:
            async for item in answered:
                yield item

    async def generate_on_channel(
        self,
        request: GenerateRequest,
        caller: str,
        key: str,
        avoid: tuple[str, ...] = (),
        trace: Carrier | None = None,
    ) -> AsyncIterator[Any]:
        """A request a Derender replica validated, answered as vLLM's ``serve_tokens``
        answers it, on the caller's step channel."""
        items = self._generate_items(request, key=key, trace=trace)
        async for item in self._outboxes.bind(items, caller, key):
            yield item

    async def _generate_items(
        self,
        request: GenerateRequest,
        key: str | None = None,
        trace: Carrier | None = None,
    ) -> AsyncGenerator[str | GenerateResponseBase | ErrorResponse, None]:
        with tracing.traced(
            "generate",
            trace,
            attributes=tracing.span_attributes(request.request_id, serve_request_id),
        ) as span:
            call = self._calls.open(key, trace=tracing.carrier_of(span))
            try:
                with call.opening():
                    result = await self._calls.serve_tokens(request, call)
                if isinstance(result, (ErrorResponse, GenerateResponseBase)):
                    yield result
                    return
                async with contextlib.aclosing(result) as events:
                    async for event in events:
                        yield event
            finally:
                await self._calls.close(call, key)

    async def text_on_channel(
        self,
        rendered: RenderedText,
        resume: TextResume | None,
        caller: str,
        key: str,
        avoid: tuple[str, ...] = (),
    ) -> AsyncIterator[Any]:
        """Inline text placement: OpenAI chat/completion output next to the engine,
        a stream's events on the caller's step channel; ``resume``: a stream that
        moved here, to go on from (``text/inline_move.py``)."""
        items = ingress_items(self._text_items(rendered, resume))
        async for item in self._outboxes.bind(items, caller, key):
            yield item

    async def _text_items(
        self, rendered: RenderedText, resume: TextResume | None
    ) -> AsyncGenerator[Any, None]:
        if self._config.tokens_only:
            yield bad_request(
                "inline text needs a tokenizer on Generate, but this graph runs tokens_only"
            )
            return
        self._calls.refuse_if_leaving()
        job = rendered.open()
        if resume is None:  # a moved stream's client has its headers
            yield served_by("inline", with_pid=self._config.expose_replica_pid)
        attributes = tracing.span_attributes(
            rendered.request_id, serve_request_id, placement="inline"
        )
        with tracing.traced("generate", rendered.trace, attributes=attributes) as span:
            call = self._calls.open(
                None, movable=inline_call_movable(job), trace=tracing.carrier_of(span)
            )

            def serve(request: GenerateRequest) -> Awaitable[Any]:
                return self._calls.serve_tokens(request, call)

            try:
                if job.beam_search:  # vLLM's completion server's, beside the engine
                    with call.opening():
                        yield await self._calls.serve_completion(job.completion_request, call)
                    return
                items = self._inline.items(job, resume, serve, call.opening)
                async with contextlib.aclosing(items) as answered:
                    async for item in answered:
                        yield item
            finally:
                await self._calls.close(call, None)

    async def _on_control(self, command: ControlCommand) -> int | EngineState | HostLoad | None:
        if command.kind == "abort":
            return await abort_held(self._engine, command.request_ids)
        if command.kind == "engine_state":
            return self._engine_state()
        if command.kind == "abort_calls":
            return self._calls.abort_calls(command.request_ids)
        if command.kind == "host_load":
            return self._host.reading()
        return None

    def _engine_state(self) -> EngineState:
        """This replica's engine for ``/metrics``: what it holds now, and vLLM's metrics."""
        return EngineState(
            replica=self._replica,
            unfinished_requests=self._engine.get_num_unfinished_requests(),
            vllm_metrics=local_vllm_metrics(),
        )

    def record_routing_stats(self) -> dict[str, Any]:
        """Serve asks every ``stats_period_s``; its controller pushes the answer to the
        routers: the blocks the engine holds, how full its KV cache is, and how many of
        the requests Serve counts on it are step channels."""
        blocks = getattr(self, "_blocks", None)  # None too while the engine starts
        if blocks is None:
            return {}
        stats = {
            ROUTING_STATS_KEY: blocks.routing_stats(),
            KV_USE_KEY: kv_cache_use(),
            CHANNELS_KEY: self._outboxes.open_channels,
        }
        if self._config.request_channels:  # else its queue length is Serve's alone
            stats[CHANNEL_REQUESTS_KEY] = self.channel_requests()
        return stats

    async def check_health(self) -> None:
        await self._engine.check_health()

    def __del__(self) -> None:
        watchdog = getattr(self, "_watchdog", None)
        if watchdog is not None:  # a shutdown stops the engine on purpose
            watchdog.cancel()
        control = getattr(self, "_control", None)
        if control is not None:
            control.stop()
        events = getattr(self, "_events", None)
        if events is not None:
            events.stop()
        engine = getattr(self, "_engine", None)
        if engine is not None and hasattr(engine, "shutdown"):
            engine.shutdown()
