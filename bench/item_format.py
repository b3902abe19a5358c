"""CPU per chunk of the Generate → text hop's item format: vLLM's SSE string,
the typed chunk, or a compact tuple.

    python -m bench.item_format --out docs/item-format.md

Generate answers a text job with vLLM's own ``ServingTokens`` stream, which
writes each engine output as an SSE string (``model_dump_json``); the text
side (Derender, or the inline text next to the engine) reads it back
(``json.loads`` + ``model_validate``). Issue 13 asks whether typed items would
be cheaper. Every form has to cross the hop as a Ray item, so each is timed
with the pickling a step-channel batch of ``--streams`` chunks pays:

- **sse string**: ``model_dump_json`` → pickle → ``json.loads`` + ``model_validate``;
- **typed chunk**: the ``GenerateTokensStreamResponse`` itself, pickled;
- **compact tuple**: ``(index, token_ids, finish_reason, stop_reason, logprobs)``
  pickled, and the chunk model built from it on the far side.

Each with and without ``top_logprobs`` 5. Process CPU time, in one process.
"""

from __future__ import annotations

import argparse
import json
import pickle
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
    GenerateLogProbs,
    GenerateTokensStreamChoice,
    GenerateTokensStreamResponse,
)

# The fields vLLM's stream generator leaves out of a token-bearing chunk.
EXCLUDE = {"prompt_token_ids", "mm_placeholders", "metrics"}


def chunk(token_id: int, top: int) -> GenerateTokensStreamResponse:
    logprobs = None
    if top:
        logprobs = GenerateLogProbs.model_validate(
            {
                "content": [
                    {
                        "token_id": token_id,
                        "logprob": -0.25,
                        "top_logprobs": [
                            {"token_id": token_id + i, "logprob": -0.25 - i} for i in range(top)
                        ],
                    }
                ]
            }
        )
    return GenerateTokensStreamResponse(
        request_id=f"generate-tokens-chatcmpl-{token_id:032x}",
        choices=[
            GenerateTokensStreamChoice(
                index=0, token_ids=[token_id], finish_reason=None, logprobs=logprobs
            )
        ],
    )


def sse_round_trip(chunks: list[GenerateTokensStreamResponse]) -> None:
    items = [f"data: {c.model_dump_json(exclude=EXCLUDE)}\n\n" for c in chunks]
    for text in pickle.loads(pickle.dumps(items)):
        GenerateTokensStreamResponse.model_validate(json.loads(text[6:]))


def typed(chunks: list[GenerateTokensStreamResponse]) -> None:
    pickle.loads(pickle.dumps(chunks))


def compact(chunks: list[GenerateTokensStreamResponse]) -> None:
    items = [
        (c.request_id, ch.index, ch.token_ids, ch.finish_reason, ch.stop_reason, ch.logprobs)
        for c in chunks
        for ch in c.choices
    ]
    for request_id, index, ids, finish, stop, logprobs in pickle.loads(pickle.dumps(items)):
        GenerateTokensStreamResponse.model_construct(
            request_id=request_id,
            choices=[
                GenerateTokensStreamChoice.model_construct(
                    index=index,
                    token_ids=ids,
                    finish_reason=finish,
                    stop_reason=stop,
                    logprobs=logprobs,
                )
            ],
        )


FORMS: dict[str, Callable[[list[GenerateTokensStreamResponse]], None]] = {
    "sse string (now)": sse_round_trip,
    "typed chunk": typed,
    "compact tuple": compact,
}


def us_per_chunk(
    form: Callable[[list[GenerateTokensStreamResponse]], None], streams: int, top: int, rounds: int
) -> float:
    batches = [[chunk(1000 * r + s, top) for s in range(streams)] for r in range(rounds)]
    start = time.process_time()
    for batch in batches:
        form(batch)
    return (time.process_time() - start) / (rounds * streams) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=24, help="chunks per batch")
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    lines = [
        "# Item format of the Generate → text hop: CPU per chunk",
        "",
        f"`{' '.join(['python -m bench.item_format', *sys.argv[1:]])}`",
        "",
        f"Host: {platform.machine()}, Python {platform.python_version()}; one token per "
        f"chunk, batches of {args.streams} chunks (one step-channel item), "
        f"{args.rounds} batches per cell; process CPU µs per chunk, both ends of the hop "
        "together (write, Ray's pickling, read).",
        "",
        "| form | no logprobs | top_logprobs 5 |",
        "|---|---|---|",
    ]
    for name, form in FORMS.items():
        us_per_chunk(form, args.streams, 0, 50)  # warm up
        plain = us_per_chunk(form, args.streams, 0, args.rounds)
        top = us_per_chunk(form, args.streams, 5, args.rounds)
        lines.append(f"| {name} | {plain:.1f} | {top:.1f} |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
