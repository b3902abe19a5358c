"""A prefill-heavy sibling of the embedded model, for benchmarks where prefill matters.

    python -m bench.prefill_model --out /tmp/prefill-heavy

The embedded model (hidden 128, 2 layers) prefills a few thousand tokens in
tens of milliseconds here, so a request's TTFT is mostly the graph's fixed
cost and a prefix-cache hit has little to save. This one has the embedded
model's tokenizer and chat template and the same architecture (Qwen3), with
``FACTOR``× the weights per token: hidden 256, intermediate 768, 4 layers, 4
query and 2 KV heads of 64. Its weights are random (seeded), so its text is
noise (plain text tokens: no special ones, so answers are never empty); what
it is for is a prefill whose cost has a real model's shape. It is built on
demand, not shipped.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from deployments.config.graph_config import TINY_MODEL

SHAPE = {
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,  # vLLM's CPU attention needs >= 32
}
FACTOR = 8  # weights per token against the embedded model's, layers only (see test_bench)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
)
SEED = 0


def build(out: Path, source: Path = TINY_MODEL) -> Path:
    """The model at ``out`` (built once: an existing one is kept)."""
    if (out / "config.json").exists():
        return out
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config_dict = json.loads((source / "config.json").read_text())
    config_dict.update(SHAPE)
    config_dict["layer_types"] = ["full_attention"] * SHAPE["num_hidden_layers"]
    torch.manual_seed(SEED)
    model = Qwen3ForCausalLM(Qwen3Config(**config_dict))
    # Random weights would greedily pick ids past the tokenizer (the vocabulary is
    # padded) or special tokens: an answer with no text, so no TTFT. With their
    # embedding rows zero (tied, so their logits are 0), the answer is plain text.
    added = json.loads((source / "tokenizer.json").read_text())["added_tokens"]
    first_special = min(token["id"] for token in added)
    with torch.no_grad():
        model.model.embed_tokens.weight[first_special:] = 0
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copy(source / name, out / name)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("/tmp/prefill-heavy"))
    print(build(parser.parse_args().out))


if __name__ == "__main__":
    main()
