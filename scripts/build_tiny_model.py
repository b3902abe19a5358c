"""Build the embedded default model, ``models/tiny-chat``, deterministically.

No model hub is reachable from where this project runs, so the project ships
its own model: a two-layer Qwen3-architecture network with a byte-level BPE
tokenizer trained here, a Qwen3-style chat template, and weights trained for a
few seconds on a synthetic corpus, so that greedy decoding gives three shapes:

- a plain chat answer (``<think>\\n\\n</think>\\n\\n`` then the answer, as Qwen3 does);
- with ``tools`` in the request, ``<tool_call>{"name": …, "arguments": …}</tool_call>``;
- for a ``think:`` prompt, ``<think> … </think>`` followed by an answer.

Same script, same machine type, same bytes: ``--check`` rebuilds into a
temporary folder and compares every file with the committed one.

    python scripts/build_tiny_model.py            # (re)write models/tiny-chat
    python scripts/build_tiny_model.py --check    # rebuild and compare
"""

from __future__ import annotations

import argparse
import filecmp
import json
import random
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "models" / "tiny-chat"
TEMPLATE = REPO / "models" / "tiny_chat_template.jinja"

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


def build(out: Path) -> None:
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(SEED)
    random.seed(SEED)
    torch.set_num_threads(1)  # a fixed reduction order: the same bytes on every run
    torch.use_deterministic_algorithms(True)

    template = TEMPLATE.read_text()
    data = examples()
    prompts = [render_prompt(template, ex) for ex in data]
    replies = [ex.reply + "<|im_end|>" for ex in data]

    raw_tok = train_tokenizer([p + r for p, r in zip(prompts, replies, strict=False)])
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

    # Loss only on the reply: the prompt is given, never generated.
    rows, labels = [], []
    for prompt, reply in zip(prompts, replies, strict=False):
        p = raw_tok.encode(prompt).ids
        r = raw_tok.encode(reply).ids
        rows.append(p + r)
        labels.append([-100] * len(p) + r)
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    target = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (row, lab) in enumerate(zip(rows, labels, strict=False)):
        input_ids[i, : len(row)] = torch.tensor(row)
        target[i, : len(lab)] = torch.tensor(lab)
        mask[i, : len(row)] = 1

    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    model.train()
    for step in range(TRAIN_STEPS):
        loss = model(input_ids=input_ids, attention_mask=mask, labels=target).loss
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
    _check_greedy(model, input_ids, mask, target)


def _check_greedy(model, input_ids, mask, target) -> None:
    """Fail the build unless greedy decoding reproduces every trained reply.

    Teacher-forced argmax equals the target at every reply position exactly
    when greedy decoding regenerates the reply, so one forward pass checks all.
    """
    import torch

    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=mask).logits
    predicted = logits[:, :-1].argmax(-1)
    wanted = target[:, 1:]
    scored = wanted != -100
    wrong_rows = ((predicted != wanted) & scored).any(dim=1)
    bad = int(wrong_rows.sum())
    print(f"greedy replies reproduced: {len(wrong_rows) - bad}/{len(wrong_rows)}", file=sys.stderr)
    if bad:
        raise SystemExit(f"{bad} trained replies are not reproduced by greedy decoding")


def same_tree(a: Path, b: Path) -> list[str]:
    """Names of files that differ between two model folders."""
    names = sorted({p.name for p in a.iterdir()} | {p.name for p in b.iterdir()})
    return [
        n
        for n in names
        if not ((a / n).exists() and (b / n).exists() and filecmp.cmp(a / n, b / n, shallow=False))
    ]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument(
        "--check", action="store_true", help="rebuild in a temp dir and compare with --out"
    )
    args = ap.parse_args()
    if not args.check:
        build(args.out)
        return
    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp))
        diff = same_tree(args.out, Path(tmp))
    if diff:
        raise SystemExit(f"rebuild differs from {args.out}: {diff}")
    print(f"rebuild is bit-for-bit equal to {args.out}")


if __name__ == "__main__":
    main()
