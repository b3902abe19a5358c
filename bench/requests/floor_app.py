"""Serve's floor for the graph's shape: the same hops, no vLLM, no text work.

    serve run bench.requests.floor_app:app   # `python -m bench.requests --servers floor`

An Ingress (FastAPI behind Serve's HTTP edge) takes a streamed chat, makes one unary
handle call to Render (which returns token ids) and one streamed call for the text:
inline, to Generate, which yields a chat chunk per token, each after a 5 ms "step";
tier (``X-Text-Placement: tier``), to Derender, which makes its own streamed call to
Generate and passes the chunks on. The answer has the shape the request bench reads
(chat chunks, a usage chunk, ``[DONE]``).

Every call and every streamed item crosses Serve as in the graph (the same switches,
DeploymentHandles, one replica per deployment, Serve's access log at the Ingress only),
but each replica does nothing else, so the CPU this app takes per request is what
Serve's edge, handles and Ray take for a request of the graph's shape. No model, no
engine; a request's answer is made up.

By default Generate yields an item per chunk, 5 ms apart: more than the graph's hops take.
Two switches, read from the environment when a replica imports this module, make it the
least floor (``--servers floor-min``), the part of the graph's cost no change to the
graph's own code removes while its tiers talk through Serve's handles:
``FLOOR_ITEMS=joined`` sends Generate's stream in two items, its first token and then the
rest with its end (what the graph's step channel sends for a short stream: one item as
soon as the first token is there, then its end at once); ``FLOOR_STEP_MS`` sets the step
(1.25 ms there: vLLM's engine made about 690 steps a second at concurrency 1 on this
host), so a request lasts about as long as vLLM's, and Ray's wall-time costs are not
spread over fewer requests than vLLM serves.

``FLOOR_ENGINE=vllm`` (``--servers floor-engine``, with the least floor's two items) puts
vLLM's engine behind Generate: the graph's engine, started as a Generate replica starts
it (``GraphConfig``'s defaults: the embedded model, one engine thread), paces the stream
with its real steps, and Generate sends the first item when the engine's first token is
there and the rest when the request ends; the engine does not detokenize and no text is
made. That is the graph with none of its serving work: Serve's least hops plus vLLM's
engine as a Serve replica runs it, on the graph's wall time, so the engine's spin-wait
(vLLM's CPU engine spins while it has work) counts as it does for the graph.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, StreamingResponse
from ray import serve
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

STEP_S = float(os.environ.get("FLOOR_STEP_MS", "5")) / 1000
"""A decode step of the embedded model on this host, about (its TPOT p50 idle)."""
JOINED = os.environ.get("FLOOR_ITEMS") == "joined"
ENGINE = os.environ.get("FLOOR_ENGINE") == "vllm"
# As in the graph by default (observability.access_log): Serve's access line per HTTP
# request at the Ingress, none for the calls between tiers.
BEHIND_THE_INGRESS = {"enable_access_log": False}

api = FastAPI()


def _chunk(request_id: str, created: int, delta: dict[str, Any], **extra: Any) -> str:
    chunk = {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": "floor",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}],
        **extra,
    }
    return f"data: {json.dumps(chunk)}\n\n"


@serve.deployment(
    name="Render",
    ray_actor_options={"num_cpus": 0},
    max_ongoing_requests=1000,
    logging_config=BEHIND_THE_INGRESS,
)
class FloorRender:
    async def render(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = json.dumps(body["messages"])
        return {"token_ids": [ord(c) % 256 for c in prompt], "max_tokens": body["max_tokens"]}


def _generate_actor_options() -> dict[str, Any]:
    """Generate's actor: the graph's Generate's core and engine environment with an
    engine, else nothing (the floor's replicas ask Ray for no CPU)."""
    if not ENGINE:
        return {"num_cpus": 0}
    from deployments.config.graph_config import GraphConfig
    from deployments.declarations.generate import engine_env

    return {"num_cpus": 1, "runtime_env": {"env_vars": engine_env(GraphConfig())}}


@serve.deployment(
    name="Generate",
    ray_actor_options=_generate_actor_options(),
    max_ongoing_requests=1000,
    logging_config=BEHIND_THE_INGRESS,
)
class FloorGenerate:
    async def __init__(self) -> None:  # type: ignore[misc]
        self._engine = await _start_engine() if ENGINE else None
        self._unfinished = 0

    def unfinished(self) -> int:
        """Streams begun and not ended: what the engine holds, where there is one."""
        return self._unfinished

    async def text(self, rendered: dict[str, Any]) -> AsyncIterator[str]:
        self._unfinished += 1
        try:
            async for item in self._text(rendered):
                yield item
        finally:
            self._unfinished -= 1

    async def _text(self, rendered: dict[str, Any]) -> AsyncIterator[str]:
        tokens = rendered["max_tokens"]
        chunks = _answer(rendered)
        if self._engine is not None:
            async for item in _engine_items(self._engine, rendered, chunks):
                yield item
            return
        if not JOINED:
            yield chunks[0]
            for i in range(tokens):
                await asyncio.sleep(STEP_S)
                yield chunks[1 + i]
            for chunk in chunks[1 + tokens :]:
                yield chunk
            return
        # The role chunk with the first token's after a step, then the rest with the end
        # after the other steps: one timer each, as one engine step serves every stream.
        await asyncio.sleep(STEP_S)
        yield "".join(chunks[:2])
        await asyncio.sleep(STEP_S * (tokens - 1))
        yield "".join(chunks[2:])


async def _start_engine() -> Any:
    """vLLM's engine as the graph's Generate replica starts it (the same flags)."""
    from deployments.config.graph_config import GraphConfig
    from deployments.vllm_adapter.engine_args import serve_namespace
    from deployments.vllm_adapter.engine_start import start_vllm_engine
    from deployments.vllm_adapter.worker_fork import remember_worker_start

    remember_worker_start()
    return await start_vllm_engine(serve_namespace(GraphConfig(), role="generate"))


async def _engine_items(engine: Any, rendered: dict[str, Any], chunks: list[str]) -> Any:
    """The answer in two items, paced by the engine: the role chunk with the first
    token's once the engine has a token, then the rest when the request ends."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(
        max_tokens=rendered["max_tokens"], temperature=0, ignore_eos=True, detokenize=False
    )
    prompt = TokensPrompt(prompt_token_ids=rendered["token_ids"])
    sent_first = False
    async for output in engine.generate(prompt, params, f"floor-{uuid.uuid4().hex}"):
        if not sent_first and output.outputs[0].token_ids:
            sent_first = True
            yield "".join(chunks[:2])
    yield "".join(chunks[2:] if sent_first else chunks)


def _answer(rendered: dict[str, Any]) -> list[str]:
    """A chat's SSE events: the role chunk, a chunk per token, usage, ``[DONE]``."""
    request_id, created = f"chatcmpl-{time.monotonic_ns()}", int(time.time())
    tokens = rendered["max_tokens"]
    chunks = [_chunk(request_id, created, {"role": "assistant", "content": ""})]
    chunks += [_chunk(request_id, created, {"content": f" w{i}"}) for i in range(tokens)]
    usage = {
        "prompt_tokens": len(rendered["token_ids"]),
        "completion_tokens": tokens,
        "total_tokens": len(rendered["token_ids"]) + tokens,
    }
    last = {"id": request_id, "object": "chat.completion.chunk", "created": created}
    chunks.append(
        f"data: {json.dumps({**last, 'model': 'floor', 'choices': [], 'usage': usage})}\n\n"
    )
    chunks.append("data: [DONE]\n\n")
    return chunks


@serve.deployment(
    name="Derender",
    ray_actor_options={"num_cpus": 0},
    max_ongoing_requests=1000,
    logging_config=BEHIND_THE_INGRESS,
)
class FloorDerender:
    def __init__(self, generate: DeploymentHandle) -> None:
        self._generate = generate.options(stream=True)

    async def chat(self, rendered: dict[str, Any]) -> AsyncIterator[str]:
        async for item in cast(DeploymentResponseGenerator, self._generate.text.remote(rendered)):
            yield item


@serve.deployment(name="Ingress", ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1000)
@serve.ingress(api)
class FloorIngress:
    def __init__(
        self, render: DeploymentHandle, generate: DeploymentHandle, derender: DeploymentHandle
    ) -> None:
        self._render = render
        self._unfinished = generate.unfinished
        self._generate = generate.options(stream=True)
        self._derender = derender.options(stream=True)

    @api.get("/health")
    async def health(self) -> dict[str, str]:
        return {}

    @api.get("/metrics")
    async def metrics(self) -> PlainTextResponse:
        """The one gauge the benches wait on before a cell (``bench/metrics.py``): the
        streams Generate holds, in the graph's name for its engine's requests."""
        held = await self._unfinished.remote()
        return PlainTextResponse(f'scaleout_engine_unfinished_requests{{replica="floor"}} {held}\n')

    @api.post("/v1/chat/completions")
    async def chat(self, request: Request) -> StreamingResponse:
        rendered = await self._render.render.remote(await request.json())
        if request.headers.get("x-text-placement") == "tier":
            stream = self._derender.chat.remote(rendered)
        else:
            stream = self._generate.text.remote(rendered)
        assert isinstance(stream, DeploymentResponseGenerator)
        return StreamingResponse(stream, media_type="text/event-stream")


_generate = cast(Any, FloorGenerate).bind()
app = cast(Any, FloorIngress).bind(
    cast(Any, FloorRender).bind(), _generate, cast(Any, FloorDerender).bind(_generate)
)
