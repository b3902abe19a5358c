"""How often a stream moved to another engine differs from one that was never moved.

    python -m bench.resume_exactness --prompts 8 --tokens 1000 --out docs/resume-exactness.md

A moved stream goes on as a fresh greedy request whose prompt is the original
prompt plus the tokens delivered (``deployments/transport/migration.py``): the
new engine prefills those tokens, where the first one decoded them one at a time.
Prefill and decode kernels may round differently, so greedy choices can part. On
vLLM's own server (the same engine the graph runs), for each prompt: one greedy
uninterrupted run, then a continuation from each move point; the report counts
the continuations equal to the run's rest, and where the others first differ.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import httpx

from bench.harness.host import host_line
from bench.harness.servers import running_vllm
from bench.startup import revision
from deployments.config.graph_config import TINY_MODEL

REPO = Path(__file__).resolve().parent.parent
MOVE_POINTS = (100, 250, 500, 750)


def _greedy(client: httpx.Client, prompt: list[int], tokens: int) -> list[int]:
    answer = client.post(
        "/v1/completions",
        json={
            "model": str(TINY_MODEL),
            "prompt": prompt,
            "max_tokens": tokens,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )
    answer.raise_for_status()
    token_ids: list[int] = answer.json()["choices"][0]["token_ids"]
    assert len(token_ids) == tokens, len(token_ids)
    return token_ids


def _prompt(client: httpx.Client, i: int) -> list[int]:
    text = f"Story {i}: once upon a time, in a land of {i * 7} rivers,"
    answer = client.post("/tokenize", json={"model": str(TINY_MODEL), "prompt": text})
    answer.raise_for_status()
    return list(answer.json()["tokens"])


def measure(prompts: int, tokens: int) -> list[tuple[int, int, int | None]]:
    """(prompt, move point, first differing position after it or None) per continuation."""
    rows: list[tuple[int, int, int | None]] = []
    with tempfile.TemporaryDirectory() as work, running_vllm(
        # Without prefix caching: the engine a stream moves to holds none of its blocks,
        # and prefills them all; a cached prefix would reuse the decoded run's.
        Path(work) / "vllm.log", max_model_len=2048, kv_cache_gib=1,
        extra_args=["--no-enable-prefix-caching"],
    ) as server, httpx.Client(base_url=server.base_url, timeout=600) as client:  # fmt: skip
        for i in range(prompts):
            prompt = _prompt(client, i)
            whole = _greedy(client, prompt, tokens)
            for at in (p for p in MOVE_POINTS if p < tokens):
                rest = _greedy(client, prompt + whole[:at], tokens - at)
                differ = next(
                    (j for j, (a, b) in enumerate(zip(rest, whole[at:], strict=True)) if a != b),
                    None,
                )
                rows.append((i, at, differ))
    return rows


def report(rows: list[tuple[int, int, int | None]], prompts: int, tokens: int) -> str:
    equal = sum(differ is None for _, _, differ in rows)
    lines = [
        "# A moved stream against one never moved",
        "",
        f"Written by `python -m bench.resume_exactness --prompts {prompts} --tokens {tokens}` "
        f"at commit {revision(REPO)}: the embedded model on vLLM's own server (CPU), "
        f"{prompts} prompts, one greedy uninterrupted run of {tokens} tokens each, and a "
        "greedy continuation from the prompt plus the run's first *k* tokens for each move "
        "point *k* (what a moved stream asks the new engine for), prefix caching off (the "
        "new engine prefills every token).",
        "",
        f"Host: {host_line()}. Kernels differ by instruction set, so another host may part "
        "where this one does not.",
        "",
        f"**{equal} of {len(rows)} continuations equal the uninterrupted run's rest.**",
        "",
        "| prompt | move after | continuation |",
        "|---|---|---|",
    ]
    for i, at, differ in rows:
        told = "equal" if differ is None else f"differs from token {at + differ} on"
        lines.append(f"| {i} | {at} | {told} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    text = report(measure(args.prompts, args.tokens), args.prompts, args.tokens)
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
