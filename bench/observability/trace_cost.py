"""What tracing costs a request when it is off, and the spans' own cost when it is on,
timed in this process on the calls the graph makes per request.

    python -m bench.observability.trace_cost --out docs/observability/trace-cost.md

Off (the default), a request runs, in all its tiers together: the Ingress's check for
a span, the ``trace`` keyword of its two tier calls (none), the ``generate`` block with
no span (and its engine call's trace context, None), the ``response`` span that is
not made. One "request" here is that sequence, an inline stream's; a tier stream adds
one more check (``traced_stream``). The off figure is an upper bound: it includes the
engine call's own bookkeeping (``EngineCall``, its ``opening`` block), which predates
tracing and runs either way. On, the same sequence makes its spans (Ingress,
render, generate, response) with their carriers and hands them to the OTLP batch
exporter; the exporter's thread (serializing, gRPC) is not in the figure, and vLLM's
own engine span neither: the request benchmarks' ``traced`` variants measure all of it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path

from bench.harness.otlp_collector import running_collector
from deployments.observability import tracing
from deployments.vllm_adapter.engine_streams import EngineCall

# Traced requests a round: their spans fit the batch exporter's queue (2,048), so none
# is dropped, and they are sent between rounds, not while one is timed.
ON_REQUESTS = 400


def one_request() -> None:
    """The tracing calls of one inline stream, in the order the tiers make them."""
    # Ingress: its span (the middleware), and the carrier its calls pass.
    span = tracing.start_span("POST /v1/chat/completions", tracing.request_parent({}))
    with tracing.serving(tracing.carrier_of(span)):
        render_kwargs, generate_kwargs = (
            tracing.request_trace_kwargs(),
            tracing.request_trace_kwargs(),
        )
        # Render (answers_ingress): its span under the Ingress's.
        with tracing.traced("render", render_kwargs.get("trace")):
            pass
        # Generate: its span, and its engine call's trace context.
        attributes = tracing.span_attributes("chatcmpl-0", lambda: "r", placement="inline")
        with tracing.traced("generate", generate_kwargs.get("trace"), attributes=attributes) as g:
            call = EngineCall(True, tracing.carrier_of(g))
            with call.opening():
                pass
        # Ingress: the response's span, from the first item to the last.
        answer = tracing.start_span(
            "response", tracing.request_carrier(), attributes={"scaleout.callee": "Generate"}
        )
        tracing.end_span(answer)
    tracing.end_span(span)


async def per_request_us(n: int, rounds: int) -> list[float]:
    one_request()  # warm
    figures = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            one_request()
        figures.append((time.perf_counter() - start) / n * 1e6)
        # The exporter's queue sent between rounds, so its thread does not run in one.
        tracing.flush_tracing()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20000, help="per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    tracing.configure_tracing(None, "bench")
    off = asyncio.run(per_request_us(args.requests, args.rounds))
    with running_collector() as collector:
        tracing.configure_tracing(collector.endpoint, "bench")
        on = asyncio.run(per_request_us(ON_REQUESTS, args.rounds))
        tracing.configure_tracing(None, "bench")
        sent = len(collector.spans())

    def row(name: str, figures: list[float]) -> str:
        spread = f"{min(figures):.2f}–{max(figures):.2f}"
        return f"| {name} | {statistics.median(figures):.2f} | {spread} |"

    text = "\n".join(
        [
            "# Tracing's cost per request, timed in process",
            "",
            f"`python -m bench.observability.trace_cost --requests {args.requests} "
            f"--rounds {args.rounds}` ({args.rounds} rounds; on: {ON_REQUESTS} requests a "
            "round, fewer than the exporter's queue holds, sent between rounds), on "
            f"this host ({os.cpu_count()} cores).",
            "",
            (__doc__ or "").split("\n\n", 2)[2].strip(),
            "",
            "| tracing | µs per request, median | rounds' spread |",
            "|---|---|---|",
            row("off (the default)", off),
            row("on: 4 spans made, carriers passed, handed to the exporter", on),
            "",
            f"Spans the collector received from the traced rounds: {sent}.",
            "",
        ]
    )
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
