"""Our config becomes the flags `vllm serve` would get, per role."""

from __future__ import annotations

from deployments.config.graph_config import GraphConfig
from deployments.vllm_adapter.engine_args import serve_cli, serve_namespace


def test_parsers_enable_auto_tool_choice() -> None:
    argv = serve_cli(
        GraphConfig.from_args({"reasoning_parser": "qwen3", "tool_call_parser": "hermes"}),
        role="render",
    )
    assert argv[argv.index("--reasoning-parser") + 1] == "qwen3"
    assert "--enable-auto-tool-choice" in argv
    assert argv[argv.index("--tool-call-parser") + 1] == "hermes"


def test_tokens_only_generate_drops_parsers_but_render_keeps_them() -> None:
    config = GraphConfig.from_args(
        {
            "tokens_only": True,
            "text_placement": "tier",
            "reasoning_parser": "qwen3",
            "tool_call_parser": "hermes",
        }
    )
    generate = serve_cli(config, role="generate")
    assert "--tokens-only" in generate and "--reasoning-parser" not in generate
    assert "--reasoning-parser" in serve_cli(config, role="render")


def test_namespace_folds_reasoning_parser_into_structured_outputs() -> None:
    args = serve_namespace(GraphConfig.from_args({"reasoning_parser": "qwen3"}), role="generate")
    assert args.structured_outputs_config.reasoning_parser == "qwen3"
    assert args.enable_scale_out is True
    assert args.served_model_name == [args.model]


def test_logits_processors_reach_the_engine_only() -> None:
    names = ["bench.harness.paced_decode:PacedDecode", "pkg.mod:Other"]
    config = GraphConfig.from_args({"logits_processors": names})
    args = serve_namespace(config, role="generate")
    assert args.logits_processors == names
    assert "--logits-processors" not in serve_cli(config, role="render")


def test_a_cpu_engine_gets_the_seeded_rewind_worker_and_a_gpu_engine_vllms_own() -> None:
    from vllm.utils.import_utils import resolve_obj_by_qualname

    from deployments.vllm_adapter.cpu_worker import SeededRewindCPUWorker

    cpu = serve_namespace(GraphConfig.from_args({}), role="generate")
    assert resolve_obj_by_qualname(cpu.worker_cls) is SeededRewindCPUWorker
    gpu = serve_cli(GraphConfig.from_args({"num_gpus": 1}), role="generate")
    assert "--worker-cls" not in gpu
    assert "--worker-cls" not in serve_cli(GraphConfig.from_args({}), role="render")


def test_a_traced_graph_gives_the_engine_its_endpoint_and_vllm_takes_it() -> None:
    config = GraphConfig.from_args({"observability": {"otlp_traces_endpoint": "http://c:4317"}})
    assert serve_namespace(config, role="generate").otlp_traces_endpoint == "http://c:4317"
    assert "--otlp-traces-endpoint" not in serve_cli(config, role="render")
    untraced = serve_cli(GraphConfig.from_args({}), role="generate")
    assert "--otlp-traces-endpoint" not in untraced
