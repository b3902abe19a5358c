"""GraphConfig: typed args, clear errors, cross-field checks at build time."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from deployments.config.graph_config import TINY_MODEL, GraphConfig, nest_dotted
from deployments.vllm_adapter.engine_start import replica_cores


def test_defaults_point_at_the_embedded_model() -> None:
    config = GraphConfig.from_args({})
    assert config.model == str(TINY_MODEL)
    assert config.model_name == str(TINY_MODEL)
    assert config.num_gpus == 0


def test_cli_strings_are_coerced_and_dotted_keys_nest() -> None:
    config = GraphConfig.from_args(
        {
            "max_model_len": "2048",
            "tokens_only": "true",
            "text_placement": "tier",
            "generate.num_replicas": "2",
        }
    )
    assert config.max_model_len == 2048
    assert config.tokens_only is True
    assert config.generate.num_replicas == 2


def test_unknown_key_is_an_error_naming_it() -> None:
    with pytest.raises(ValidationError, match="max_model_length"):
        GraphConfig.from_args({"max_model_length": "10"})
    with pytest.raises(ValidationError, match="num_replica"):
        GraphConfig.from_args({"generate.num_replica": "2"})


def test_missing_model_folder_is_an_error() -> None:
    with pytest.raises(ValidationError, match="does not exist"):
        GraphConfig.from_args({"model": "/nonexistent/model"})


def test_hub_ids_are_not_checked_on_disk() -> None:
    assert GraphConfig.from_args({"model": "Qwen/Qwen3-8B"}).model == "Qwen/Qwen3-8B"


def test_autoscaling_bounds_and_exclusivity() -> None:
    with pytest.raises(ValidationError, match="exceeds max_replicas"):
        GraphConfig.from_args({"render": {"autoscaling": {"min_replicas": 3, "max_replicas": 2}}})
    with pytest.raises(ValidationError, match="not both"):
        GraphConfig.from_args({"render": {"num_replicas": 1, "autoscaling": {}}})


def test_tensor_parallel_needs_gpus() -> None:
    with pytest.raises(ValidationError, match="num_gpus"):
        GraphConfig.from_args({"tensor_parallel_size": "2"})


def test_deployment_options_emit_only_what_was_set() -> None:
    config = GraphConfig.from_args({"generate.max_ongoing_requests": "4"})
    assert config.generate.to_serve() == {"max_ongoing_requests": 4}
    fixed = GraphConfig.from_args({"derender.num_replicas": "2"})
    assert fixed.derender.to_serve() == {"num_replicas": 2, "autoscaling_config": None}
    scaled = GraphConfig.from_args({"render.autoscaling.max_replicas": "3"})
    assert scaled.render.to_serve()["autoscaling_config"]["max_replicas"] == 3
    assert scaled.render.to_serve()["autoscaling_config"]["look_back_period_s"] == 30.0
    window = GraphConfig.from_args({"derender.autoscaling.look_back_period_s": "15"})
    assert window.derender.to_serve()["autoscaling_config"]["look_back_period_s"] == 15.0
    with pytest.raises(ValidationError, match="look_back_period_s"):
        GraphConfig.from_args({"derender.autoscaling.look_back_period_s": "10"})


def test_nest_dotted_refuses_a_key_under_a_value() -> None:
    with pytest.raises(ValueError, match="already has a value"):
        nest_dotted({"render": "x", "render.num_cpus": "1"})


def test_api_key_is_secret() -> None:
    config = GraphConfig.from_args({"api_key": "sk-test"})
    assert "sk-test" not in repr(config)
    assert config.api_key is not None and config.api_key.get_secret_value() == "sk-test"


def test_tokens_only_rejects_inline_text() -> None:
    with pytest.raises(ValidationError, match="text_placement=tier"):
        GraphConfig.from_args({"tokens_only": "true"})
    assert GraphConfig.from_args({"tokens_only": "true", "text_placement": "tier"}).tokens_only


def test_text_placement_is_checked() -> None:
    with pytest.raises(ValidationError, match="text_placement"):
        GraphConfig.from_args({"text_placement": "sideways"})


def test_cpu_cores_binds_only_cpu_engines() -> None:
    assert GraphConfig.from_args({}).generate.cpu_cores == "auto"
    assert GraphConfig.from_args({"generate.cpu_cores": "2"}).generate.cpu_cores == 2
    assert GraphConfig.from_args({"generate.cpu_cores": "off"}).generate.cpu_cores == "off"
    assert GraphConfig.from_args({"num_gpus": 1}).generate.cpu_cores == "auto"
    with pytest.raises(ValidationError, match="cpu_cores"):
        GraphConfig.from_args({"generate.cpu_cores": "all"})
    with pytest.raises(ValidationError, match="cpu_cores"):
        GraphConfig.from_args({"generate.cpu_cores": 1, "num_gpus": 1})
    with pytest.raises(ValidationError, match="cpu_cores"):
        GraphConfig.from_args({"generate.cpu_cores": 0})


@pytest.mark.parametrize(
    ("allowed", "cores", "rank", "expected"),
    [
        ([0, 1], 1, 0, [0]),
        ([0, 1], 1, 1, [1]),
        ([0, 1], 1, 2, [0]),  # more replicas than cores: they wrap around and share
        ([4, 5, 6, 7], 2, 1, [6, 7]),
        ([7, 5, 6, 4], 2, 0, [4, 5]),  # the node's order, not the mask's
        ([0, 1, 2], 2, 1, [2, 0]),
        ([0, 1], 4, 0, [0, 1]),  # never more cores than the node has
    ],
)
def test_each_replica_on_a_node_gets_cores_of_its_own(
    allowed: list[int], cores: int, rank: int, expected: list[int]
) -> None:
    assert replica_cores(allowed, cores, rank) == expected


def test_the_cpu_autoscaling_policy_is_for_the_cpu_tiers_and_takes_their_cores() -> None:
    scaled = GraphConfig.from_args(
        {"render.autoscaling.policy": "cpu", "render.autoscaling.cores_per_replica": "2"}
    )
    policy = scaled.render.to_serve(num_cpus=0.25)["autoscaling_config"]["policy"]
    assert policy["policy_kwargs"] == {"target_utilization": 0.7, "cores_per_replica": 2.0}
    # Without cores_per_replica: the replica's num_cpus, one core where it reserves none.
    plain = GraphConfig.from_args({"derender.autoscaling.policy": "cpu"})
    assert (
        plain.derender.to_serve(0.5)["autoscaling_config"]["policy"]["policy_kwargs"][
            "cores_per_replica"
        ]
        == 0.5
    )
    assert (
        plain.derender.to_serve(0)["autoscaling_config"]["policy"]["policy_kwargs"][
            "cores_per_replica"
        ]
        == 1.0
    )
    # The default signal adds no policy: Serve's own.
    assert (
        "policy"
        not in GraphConfig.from_args(
            {"derender.autoscaling.max_replicas": "3"}
        ).derender.to_serve()["autoscaling_config"]
    )
    for tier in ("generate", "ingress"):
        with pytest.raises(ValidationError, match="render and derender only"):
            GraphConfig.from_args({f"{tier}.autoscaling.policy": "cpu"})
    with pytest.raises(ValidationError, match="cores_per_replica is for policy cpu"):
        GraphConfig.from_args({"derender.autoscaling.cores_per_replica": "1"})
