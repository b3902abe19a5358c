"""Our config → the argparse namespace vLLM's own server would build.

Each deployment hands this namespace to vLLM's own state initialisers
(``init_app_state`` / ``init_render_app_state``), so the serving classes are
built exactly as ``vllm serve`` and ``vllm launch render`` build them.
"""

from __future__ import annotations

import json
from argparse import Namespace

from deployments.config.graph_config import GraphConfig

# vLLM's CPU worker with seeded sampling that survives chunked prefill
# (deployments/vllm_adapter/cpu_worker.py); named here so that building the flags imports no vLLM.
CPU_WORKER_CLS = "deployments.vllm_adapter.cpu_worker.SeededRewindCPUWorker"


def serve_cli(
    config: GraphConfig, *, role: str, kv_events: dict[str, object] | None = None
) -> list[str]:
    """The ``vllm serve`` flags for one role: ``render``, ``generate`` or ``derender``;
    ``kv_events`` is Generate's ``--kv-events-config``."""
    argv = ["--model", config.model, "--dtype", config.dtype]
    argv += ["--served-model-name", config.model_name]
    if config.tokenizer:
        argv += ["--tokenizer", config.tokenizer]
    if config.max_model_len:
        argv += ["--max-model-len", str(config.max_model_len)]
    if config.chat_template:
        argv += ["--chat-template", config.chat_template]
    # A tokens-only engine has no tokenizer, so it cannot build parsers (vLLM
    # fails at start); parsing then happens on the render/derender tiers.
    engine_without_tokenizer = role == "generate" and config.tokens_only
    if config.reasoning_parser and not engine_without_tokenizer:
        argv += ["--reasoning-parser", config.reasoning_parser]
    if config.tool_call_parser and not engine_without_tokenizer:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", config.tool_call_parser]
    if role == "generate":
        argv += ["--enable-scale-out", "--stream-interval", str(config.stream_interval)]
        argv += ["--tensor-parallel-size", str(config.tensor_parallel_size)]
        if config.num_gpus > 0:
            argv += ["--gpu-memory-utilization", str(config.gpu_memory_utilization)]
        else:
            argv += ["--worker-cls", CPU_WORKER_CLS]
        if config.max_num_seqs:
            argv += ["--max-num-seqs", str(config.max_num_seqs)]
        if config.enforce_eager:
            argv += ["--enforce-eager"]
        if config.logits_processors:
            argv += ["--logits-processors", *config.logits_processors]
        if config.tokens_only:
            argv += ["--tokens-only"]
        if kv_events is not None:
            argv += ["--kv-events-config", json.dumps(kv_events)]
        traces = config.observability.otlp_traces_endpoint
        if traces is not None:  # the engine's own span per request (tracing.py)
            argv += ["--otlp-traces-endpoint", traces]
    return argv


def serve_namespace(
    config: GraphConfig, *, role: str, kv_events: dict[str, object] | None = None
) -> Namespace:
    """Parse :func:`serve_cli` with vLLM's own parser and checks."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import (
        make_arg_parser,
        validate_parsed_serve_args,
    )
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="scaleout-serve"))
    args = parser.parse_args(serve_cli(config, role=role, kv_events=kv_events))
    validate_parsed_serve_args(args)
    # `vllm serve` folds --reasoning-parser into the structured outputs config
    # before building app state; do the same.
    args.structured_outputs_config = AsyncEngineArgs.from_cli_args(
        args
    ).create_structured_outputs_config()
    return args
