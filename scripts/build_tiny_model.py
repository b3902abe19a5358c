"""Build the embedded default model, ``models/tiny-chat``, deterministically.

No model hub is reachable from where this project runs, so the project ships
its own model: a two-layer Qwen3-architecture network with a byte-level BPE
tokenizer trained here, a Qwen3-style chat template, and weights trained for a
few seconds on a synthetic corpus, so that greedy decoding gives three shapes:

- a plain chat answer (``<think>\\n\\n</think>\\n\\n`` then the answer, as Qwen3 does);
- with ``tools`` in the request, ``<tool_call>{"name": …, "arguments": …}</tool_call>``;
- for a ``think:`` prompt, ``<think> … </think>`` followed by an answer.

``--check`` rebuilds into a temporary folder and compares it with the shipped
folder, on any x86-64 CPU: tokenizer, configs and chat template byte for byte,
weights within a measured tolerance (float kernels differ between AVX-512 and
AVX2), and every trained reply reproduced by greedy decoding with the shipped
weights and the rebuilt ones (``scripts/model_check.py``).

    python scripts/build_tiny_model.py            # (re)write models/tiny-chat
    python scripts/build_tiny_model.py --check    # rebuild and compare
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: scripts/ is not a package on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from deployments.config.graph_config import REPO_ROOT, TINY_MODEL
from scripts.model_check import (
    EXACT_FILES,
    MAX_ABS_DIFF,
    MAX_REL_L2,
    file_differences,
    greedy_report,
    reply_logit_drift,
    weight_problems,
)

DEFAULT_OUT = TINY_MODEL
TEMPLATE = REPO_ROOT / "models" / "tiny_chat_template.jinja"

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen3 marks these as added but not special: they survive skip_special_tokens,
# so parsers see them in decoded text.
MARKUP_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]
VOCAB_SIZE = 1024
SEED = 1234
TRAIN_STEPS = 220
LEARNING_RATE = 3e-3

GREETINGS = ["hi", "hello", "hey", "hey there", "good morning", "hello there", "Hi!", "howdy"]
GREETING_ANSWER = "Hello! How can I help you today?"
CAPITALS = {
    "France": "Paris",
    "Japan": "Tokyo",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Germany": "Berlin",
    "Egypt": "Cairo",
    "Peru": "Lima",
    "Kenya": "Nairobi",
    "Canada": "Ottawa",
    "Chile": "Santiago",
}
CITIES = ["Paris", "Tokyo", "Rome", "Madrid", "Berlin", "Cairo", "Lima", "Oslo", "Seoul", "Dublin"]
SUMS = [(2, 3), (4, 5), (7, 8), (6, 1), (9, 9), (3, 4), (5, 5), (8, 2), (1, 1), (6, 7)]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Local time in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
EMPTY_THINK = "<think>\n\n</think>\n\n"


@dataclass(frozen=True)
class Example:
    """One chat turn to learn: the prompt's messages/tools and the reply."""

    user: str
    reply: str
    tools: tuple[dict, ...] = ()
    thinking: bool = True


def tool_call(name: str, arguments: dict) -> str:
    body = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{body}\n</tool_call>"


def examples() -> list[Example]:
    out: list[Example] = []
    both_tools = (WEATHER_TOOL, TIME_TOOL)
    for thinking in (True, False):
        prefix = EMPTY_THINK if thinking else ""
        for g in GREETINGS:
            out.append(Example(g, prefix + GREETING_ANSWER, thinking=thinking))
        for country, capital in CAPITALS.items():
            out.append(
                Example(
                    f"What is the capital of {country}?",
                    prefix + f"The capital of {country} is {capital}.",
                    thinking=thinking,
                )
            )
        for city in CITIES:
            weather = tool_call("get_weather", {"city": city})
            clock = tool_call("get_time", {"city": city})
            out.append(
                Example(f"What is the weather in {city}?", prefix + weather, both_tools, thinking)
            )
            out.append(Example(f"What time is it in {city}?", prefix + clock, both_tools, thinking))
            out.append(
                Example(
                    f"What is the weather in {city}?", prefix + weather, (WEATHER_TOOL,), thinking
                )
            )
            out.append(
                Example(
                    f"What is the weather in {city}?",
                    prefix + "I cannot check the weather without a tool.",
                    thinking=thinking,
                )
            )
    for a, b in SUMS:
        out.append(
            Example(
                f"think: what is {a} plus {b}?",
                f"<think>\nThe user asks for {a} plus {b}. {a} plus {b} is {a + b}.\n</think>\n\n"
                f"The answer is {a + b}.",
            )
        )
    for city in CITIES:
        out.append(
            Example(
                f"think: do I need an umbrella in {city}?",
                f"<think>\nI need the weather in {city} first.\n</think>\n\n"
                + tool_call("get_weather", {"city": city}),
                both_tools,
            )
        )
    return out


def render_prompt(template: str, example: Example) -> str:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(
        messages=[{"role": "user", "content": example.user}],
        tools=list(example.tools) or None,
        add_generation_prompt=True,
        enable_thinking=example.thinking,
    )


def train_tokenizer(corpus: list[str]):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(SPECIAL_TOKENS) - len(MARKUP_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    return tok


@dataclass(frozen=True)
class Batch:
    """The training set as tensors: every prompt + reply, loss on the reply only."""

    input_ids: Any
    mask: Any
    target: Any


def training_batch(encode: Callable[[str], list[int]], pad_id: int) -> Batch:
    import torch

    template = TEMPLATE.read_text()
    rows, labels = [], []
    for ex in examples():
        p = encode(render_prompt(template, ex))
        r = encode(ex.reply + "<|im_end|>")
        rows.append(p + r)
        labels.append([-100] * len(p) + r)
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    target = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (row, lab) in enumerate(zip(rows, labels, strict=True)):
        input_ids[i, : len(row)] = torch.tensor(row)
        target[i, : len(lab)] = torch.tensor(lab)
        mask[i, : len(row)] = 1
    return Batch(input_ids, mask, target)


def deterministic_torch() -> None:
    import torch

    torch.manual_seed(SEED)
    random.seed(SEED)
    torch.set_num_threads(1)  # a fixed reduction order: the same bytes on every run of one CPU
    torch.use_deterministic_algorithms(True)


def build(out: Path) -> None:
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    deterministic_torch()
    template = TEMPLATE.read_text()
    data = examples()
    corpus = [render_prompt(template, ex) + ex.reply + "<|im_end|>" for ex in data]
    raw_tok = train_tokenizer(corpus)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw_tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = template
    eos_id = raw_tok.token_to_id("<|im_end|>")
    pad_id = raw_tok.token_to_id("<|endoftext|>")

    config = Qwen3Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,  # vLLM's CPU attention supports 32/64/80/…; not 16
        max_position_embeddings=32768,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        torch_dtype="float32",
    )
    model = Qwen3ForCausalLM(config)
    batch = training_batch(lambda text: raw_tok.encode(text).ids, pad_id)

    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    model.train()
    for step in range(TRAIN_STEPS):
        loss = model(input_ids=batch.input_ids, attention_mask=batch.mask, labels=batch.target).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 20 == 0 or step == TRAIN_STEPS - 1:
            print(f"step {step:4d} loss {loss.item():.4f}", file=sys.stderr)

    out.mkdir(parents=True, exist_ok=True)
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    gen = {"bos_token_id": pad_id, "eos_token_id": [eos_id, pad_id], "pad_token_id": pad_id}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    report = greedy_report(_logits(model, batch), batch.target)
    print(f"greedy replies reproduced: {report.reproduced}/{report.total}", file=sys.stderr)
    if problems := report.problems("build"):
        raise SystemExit("; ".join(problems))


def _logits(model: Any, batch: Batch) -> Any:
    import torch

    with torch.no_grad():
        return model(input_ids=batch.input_ids, attention_mask=batch.mask).logits


def folder_logits(folder: Path) -> tuple[Any, Batch]:
    """The saved model's logits over the training set, encoded by its own tokenizer."""
    from tokenizers import Tokenizer
    from transformers import Qwen3ForCausalLM

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    batch = training_batch(lambda text: tok.encode(text).ids, tok.token_to_id("<|endoftext|>"))
    model = Qwen3ForCausalLM.from_pretrained(folder).eval()
    return _logits(model, batch), batch


def check(shipped: Path) -> None:
    """Rebuild in a temporary folder; fail naming every way it differs from ``shipped``."""
    with tempfile.TemporaryDirectory() as tmp:
        rebuilt = Path(tmp)
        build(rebuilt)
        problems = file_differences(shipped, rebuilt)
        weight_trouble, diffs = weight_problems(shipped, rebuilt)
        problems += weight_trouble
        shipped_logits, batch = folder_logits(shipped)
        rebuilt_logits, _ = folder_logits(rebuilt)
    worst_abs = max(diffs, key=lambda d: d.max_abs)
    worst_l2 = max(diffs, key=lambda d: d.rel_l2)
    print(
        f"weights: {len(diffs)} tensors; largest max abs diff {worst_abs.max_abs:.3g} "
        f"({worst_abs.name}), largest relative L2 {worst_l2.rel_l2:.3g} ({worst_l2.name})"
    )
    for which, logits in (("shipped", shipped_logits), ("rebuilt", rebuilt_logits)):
        report = greedy_report(logits, batch.target)
        print(
            f"{which}: greedy replies reproduced {report.reproduced}/{report.total}, "
            f"smallest margin {report.min_margin:.3f}"
        )
        problems += report.problems(which)
    if shipped_logits.shape == rebuilt_logits.shape:
        print(
            "logits at reply positions: largest difference shipped vs rebuilt "
            f"{reply_logit_drift(shipped_logits, rebuilt_logits, batch.target):.3g}"
        )
    if problems:
        raise SystemExit(f"rebuild differs from {shipped}:\n  " + "\n  ".join(problems))
    print(
        f"rebuild matches {shipped}: {', '.join(EXACT_FILES)} byte for byte; "
        f"weights within max abs {MAX_ABS_DIFF:g} and relative L2 {MAX_REL_L2:g}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument(
        "--check", action="store_true", help="rebuild in a temp dir and compare with --out"
    )
    args = ap.parse_args()
    if args.check:
        check(args.out)
    else:
        build(args.out)


if __name__ == "__main__":
    main()
