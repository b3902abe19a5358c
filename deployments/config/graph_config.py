"""The graph's configuration: one typed model, validated when the app is built.

``serve run graph:build_app key=value …`` hands every value over as a string
and nested keys as ``section.key=value``; Serve config files hand over YAML
mappings. Both land here, where an unknown key or a wrong type is an error
that names the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from deployments.config.observability import ObservabilityConfig
from deployments.config.placement import AutoPlacementConfig

if TYPE_CHECKING:
    from ray.serve.deployment import Deployment

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL = REPO_ROOT / "models" / "tiny-chat"

TextPlacement = Literal["inline", "tier", "auto"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


AutoscalingSignal = Literal["ongoing_requests", "cpu"]
# Serve's controller loads the policy by this path (deployments/scaling/cpu_policy.py;
# the config layer names it, and imports nothing above it).
CPU_POLICY = "deployments.scaling.cpu_policy:CpuUtilizationPolicy"


class AutoscalingOptions(_Strict):
    """Ray Serve ``autoscaling_config`` for one deployment."""

    min_replicas: int = Field(1, ge=0, description="Replicas kept when idle.")
    max_replicas: int = Field(1, ge=1, description="Upper bound on replicas.")
    policy: AutoscalingSignal = Field(
        "ongoing_requests",
        description="What replicas are scaled on: Serve's ongoing requests per replica "
        "(target_ongoing_requests), or the CPU each replica measures of itself "
        "(target_cpu_utilization of cores_per_replica; Render and Derender only).",
    )
    target_ongoing_requests: float = Field(
        2.0, gt=0, description="Ongoing requests (streams) per replica to aim for."
    )
    target_cpu_utilization: float = Field(
        0.7, gt=0, le=1, description="policy cpu: mean share of cores_per_replica to aim for."
    )
    cores_per_replica: float | None = Field(
        None,
        gt=0,
        description="policy cpu: cores one replica may use; default its num_cpus (1 if 0).",
    )
    upscale_delay_s: float = Field(2.0, ge=0, description="Sustained load before scaling out.")
    downscale_delay_s: float = Field(
        10.0, ge=0, description="Sustained idleness before scaling in."
    )
    # Serve warns, and will refuse, a window not longer than its metrics interval (10 s).
    look_back_period_s: float = Field(
        30.0, gt=10, description="Window over which Serve averages its signal (its default)."
    )

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingOptions:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) exceeds max_replicas ({self.max_replicas})"
            )
        if self.policy != "cpu" and self.cores_per_replica is not None:
            raise ValueError(f"cores_per_replica is for policy cpu (policy is {self.policy})")
        return self

    def to_serve(self, num_cpus: float | None = None) -> dict[str, Any]:
        """Serve's ``autoscaling_config``; ``num_cpus``: a replica's logical CPUs, the
        cores the CPU policy gives it unless ``cores_per_replica`` says otherwise."""
        serve: dict[str, Any] = {
            "min_replicas": self.min_replicas,
            "max_replicas": self.max_replicas,
            "target_ongoing_requests": self.target_ongoing_requests,
            "upscale_delay_s": self.upscale_delay_s,
            "downscale_delay_s": self.downscale_delay_s,
            "look_back_period_s": self.look_back_period_s,
        }
        if self.policy == "cpu":
            cores = self.cores_per_replica or num_cpus or 1.0
            serve["policy"] = {
                "policy_function": CPU_POLICY,
                "policy_kwargs": {
                    "target_utilization": self.target_cpu_utilization,
                    "cores_per_replica": cores,
                },
            }
        return serve


class DeploymentOptions(_Strict):
    """Replicas and resources of one deployment.

    ``num_replicas`` and ``autoscaling`` are exclusive; neither means the
    deployment class's own default.
    """

    num_replicas: int | None = Field(None, ge=1, description="Fixed replica count.")
    autoscaling: AutoscalingOptions | None = Field(None, description="Autoscale instead.")
    num_cpus: float | None = Field(None, ge=0, description="Logical CPUs per replica.")
    resources: dict[str, float] | None = Field(
        None,
        description="Custom Ray resources per replica, e.g. {engine: 1} to place Generate only "
        "on nodes that offer it (a KubeRay worker group's `resources`).",
    )
    max_ongoing_requests: int | None = Field(
        None, ge=1, description="Requests a replica runs at once before Serve queues."
    )
    max_queued_requests: int | None = Field(
        None, ge=-1, description="Requests Serve queues per handle before 503 (-1: no limit)."
    )

    @model_validator(mode="after")
    def _exclusive(self) -> DeploymentOptions:
        if self.num_replicas is not None and self.autoscaling is not None:
            raise ValueError("set num_replicas or autoscaling, not both")
        for name, amount in (self.resources or {}).items():
            if name in ("CPU", "GPU", "memory") or amount < 0:
                raise ValueError(
                    f"resources.{name}: custom resources only, none negative "
                    "(num_cpus and num_gpus set CPUs and GPUs)"
                )
        return self

    def max_replicas(self, class_default: int) -> int:
        """The most replicas the deployment can have (``class_default``: its own bound)."""
        if self.num_replicas is not None:
            return self.num_replicas
        return self.autoscaling.max_replicas if self.autoscaling is not None else class_default

    def applied_to(self, deployment: Any, actor: dict[str, Any] | None = None) -> Deployment:
        """``deployment`` (as ``deployments/declarations/`` declares it) with these replicas
        and resources over its own defaults, and ``actor`` (more Ray actor options) on
        top of its own."""
        actor_options = dict(deployment.ray_actor_options or {})
        actor_options.update(actor or {})
        if self.num_cpus is not None:
            actor_options["num_cpus"] = self.num_cpus
        if self.resources is not None:
            actor_options["resources"] = {**actor_options.get("resources", {}), **self.resources}
        serve = self.to_serve(actor_options.get("num_cpus"))
        return deployment.options(ray_actor_options=actor_options, **serve)

    def to_serve(self, num_cpus: float | None = None) -> dict[str, Any]:
        """Keyword arguments for ``Deployment.options``; only what was set (``num_cpus``:
        a replica's logical CPUs, for the CPU autoscaling policy)."""
        opts: dict[str, Any] = {}
        if self.num_replicas is not None:
            # A fixed count replaces the class's own autoscaling default.
            opts["num_replicas"] = self.num_replicas
            opts["autoscaling_config"] = None
        if self.autoscaling is not None:
            opts["autoscaling_config"] = self.autoscaling.to_serve(num_cpus)
        if self.max_ongoing_requests is not None:
            opts["max_ongoing_requests"] = self.max_ongoing_requests
        if self.max_queued_requests is not None:
            opts["max_queued_requests"] = self.max_queued_requests
        return opts


class PrefixRoutingOptions(_Strict):
    """Thresholds of Generate's prefix routing (``deployments/routing/prefix_router.py``)."""

    imbalance: int = Field(
        8,
        ge=0,
        description="Route by load instead when the best-matching replica's queue is longer "
        "than the shortest by more than this many requests.",
    )
    min_match_ratio: float = Field(
        0.1,
        ge=0,
        le=1,
        description="Route by load instead when the best replica holds fewer extra leading "
        "blocks of the prompt than this share of them.",
    )
    stats_period_s: float = Field(
        1.0, gt=0, description="How often each Generate replica reports its engine's blocks."
    )
    engine_events: bool = Field(
        True,
        description="Route on the blocks each engine reports (its KV cache events); false: "
        "only on what each router itself sent where, for a few stats periods.",
    )


class GenerateOptions(DeploymentOptions):
    """Generate's replicas and resources, and how its callers choose a replica."""

    routing: Literal["prefix", "pow2"] | None = Field(
        None,
        description="`prefix`: to the replica whose KV cache holds the longest prefix of the "
        "request; `pow2`: Serve's power of two choices. Default: prefix when Generate can have "
        "more than one replica.",
    )
    prefix_routing: PrefixRoutingOptions = Field(default_factory=PrefixRoutingOptions)
    cpu_cores: Annotated[int, Field(ge=1)] | Literal["auto", "off"] = Field(
        "auto",
        description="CPU engines: bind each replica's engine, its worker's threads "
        "(VLLM_CPU_OMP_THREADS_BIND, one per core) and its EngineCore process, to this many "
        "cores of its host that no other engine there holds (else its rank's on the node, "
        "shared). `auto`: as many as Ray gives the replica threads (its num_cpus rounded "
        "down, at least 1). `off`: unbound (VLLM_CPU_OMP_THREADS_BIND=nobind), as many "
        "threads as auto. GPU engines: auto is off.",
    )

    migration_limit: int = Field(
        3,
        ge=0,
        description="A stream whose Generate replica or engine is lost goes on on another "
        "replica, from the tokens it delivered, at most this many times (every stream but "
        "inline text); 0: it ends with an error event.",
    )
    migration_wait_s: float = Field(
        0.0,
        ge=0,
        description="How long a stream that moves waits for a Generate replica when none "
        "is running (the one replica restarting its engine, or redeployed: Serve stops "
        "it as it starts the next); 0: it ends with an error event at once.",
    )

    def routing_policy(self, class_default_replicas: int = 1) -> Literal["prefix", "pow2"]:
        if self.routing is not None:
            return self.routing
        if self.num_replicas is not None:
            most = self.num_replicas
        elif self.autoscaling is not None:
            most = self.autoscaling.max_replicas
        else:
            most = class_default_replicas
        return "prefix" if most > 1 else "pow2"


# ``graph:app``: the embedded default model this repo builds, with its parsers.
EMBEDDED_DEFAULT: dict[str, Any] = {"reasoning_parser": "qwen3", "tool_call_parser": "hermes"}


class GraphConfig(_Strict):
    """Everything ``build_app`` accepts."""

    model: str = Field(str(TINY_MODEL), description="HF-format model folder or hub id.")
    served_model_name: str | None = Field(
        None, description="Name clients send as `model`; defaults to `model`."
    )
    tokenizer: str | None = Field(None, description="Tokenizer folder or id, if not the model's.")
    dtype: str = Field("auto", description="vLLM --dtype.")
    reasoning_parser: str | None = Field(None, description="vLLM reasoning parser, e.g. qwen3.")
    tool_call_parser: str | None = Field(
        None, description="vLLM tool parser, e.g. hermes; enables auto tool choice."
    )
    chat_template: str | None = Field(None, description="Chat template file or string.")
    max_model_len: int | None = Field(None, ge=16, description="Context length; model's if unset.")
    kv_cache_gib: int = Field(
        2, ge=1, description="CPU KV cache GiB (VLLM_CPU_KVCACHE_SPACE); ignored on GPU."
    )
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="vLLM on GPU.")
    max_num_seqs: int | None = Field(None, ge=1, description="Engine batch size limit.")
    stream_interval: int = Field(1, ge=1, description="Engine steps per streamed chunk.")
    stream_coalesce_ms: float = Field(
        10.0,
        ge=0,
        le=1000,
        description="Between tiers, SSE events arriving within this window after a step "
        "channel's last item travel with them as one item (a stream's first event and its "
        "end are never held); 0 joins only events already waiting.",
    )
    request_channels: bool = Field(
        False,
        description="Derender replicas send their requests to Generate on a channel each "
        "Generate replica opens back to them (one item per event-loop turn), rather than "
        "a Serve call per request; Serve's router still picks the replica "
        "(transport/request_channel.py). Off by default: Serve writes no access line for "
        "a request that rides a channel, and no CPU saving has been measured yet.",
    )
    enforce_eager: bool = Field(False, description="Disable graph capture/compilation.")
    logits_processors: list[str] = Field(
        default_factory=list,
        description="vLLM --logits-processors: `module:Class` names the engine loads.",
    )
    tokens_only: bool = Field(
        False,
        description="Generate loads no tokenizer (vLLM --tokens-only); text mode answers 400.",
    )
    num_gpus: float = Field(0, ge=0, description="GPUs per Generate replica; 0 runs on CPU.")
    tensor_parallel_size: int = Field(1, ge=1, description="vLLM --tensor-parallel-size.")
    text_placement: TextPlacement = Field(
        "inline",
        description="Where /v1 text is made: `inline` in Generate, the Derender `tier`, or "
        "`auto`: per request, from the measured load of both (auto_placement). A request "
        "overrides it with the X-Text-Placement header.",
    )
    auto_placement: AutoPlacementConfig = Field(default_factory=AutoPlacementConfig)
    observability: ObservabilityConfig = Field(default_factory=ObservabilityConfig)
    api_key: SecretStr | None = Field(
        None, description="Bearer key for /v1 and /inference; VLLM_API_KEY if unset."
    )
    max_body_bytes: int = Field(32 * 2**20, ge=1024, description="Larger bodies get 413.")
    body_timeout_s: float = Field(
        30.0, gt=0, description="A request body not fully sent within this long gets 408."
    )
    max_body_reads_without_key: int = Field(
        64,
        ge=1,
        description="Per Ingress replica, slow request bodies (still coming after "
        "slow_body_s) read at once from clients without the API key (every client, if no "
        "key is set); more get 503. Bounds the Ingress slots that slow clients can hold.",
    )
    slow_body_s: float = Field(
        0.5,
        gt=0,
        description="A keyless body not fully in after this long counts against "
        "max_body_reads_without_key; one in sooner never does, however many come at once.",
    )
    expose_replica_pid: bool = Field(
        False,
        description="Test only: answer with `X-Served-By-Pid`, the serving replica's PID "
        "(tests kill it). Off: a client learns nothing of the host's processes.",
    )
    ingress: DeploymentOptions = Field(default_factory=DeploymentOptions)
    render: DeploymentOptions = Field(default_factory=DeploymentOptions)
    generate: GenerateOptions = Field(default_factory=GenerateOptions)
    derender: DeploymentOptions = Field(default_factory=DeploymentOptions)

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model

    @model_validator(mode="after")
    def _cross_checks(self) -> GraphConfig:
        local = Path(self.model)
        if (local.is_absolute() or self.model.startswith(".")) and not local.is_dir():
            raise ValueError(f"model folder {self.model!r} does not exist")
        if self.tokens_only and self.text_placement != "tier":
            raise ValueError(
                f"text_placement {self.text_placement!r} needs a tokenizer on Generate, "
                "which tokens_only "
                "removes; use text_placement=tier"
            )
        if self.num_gpus == 0 and self.tensor_parallel_size > 1:
            raise ValueError("tensor_parallel_size > 1 needs num_gpus > 0")
        if self.num_gpus > 0 and isinstance(self.generate.cpu_cores, int):
            raise ValueError(
                "generate.cpu_cores binds CPU engines; with num_gpus > 0 leave it auto or off"
            )
        for name in ("ingress", "generate"):
            scaling = getattr(self, name).autoscaling
            if scaling is not None and scaling.policy == "cpu":
                # Only the CPU tiers measure themselves; an engine's CPU spin-waits.
                raise ValueError(f"{name}.autoscaling.policy 'cpu' is for render and derender only")
        return self

    @classmethod
    def from_args(
        cls, args: dict[str, Any] | None, env: Mapping[str, str] | None = None
    ) -> GraphConfig:
        """Validate ``serve run`` / Serve-config args; dotted keys nest.

        ``env`` (the process environment when the app is built, not imported)
        supplies ``VLLM_API_KEY`` when the args set no ``api_key``, as vLLM does.
        """
        values = nest_dotted(args or {})
        env_key = (env or {}).get("VLLM_API_KEY")
        if env_key and values.get("api_key") is None:
            values["api_key"] = env_key
        return cls.model_validate(values)


def nest_dotted(args: dict[str, Any]) -> dict[str, Any]:
    """``{"generate.num_replicas": "2"}`` → ``{"generate": {"num_replicas": "2"}}``."""
    out: dict[str, Any] = {}
    for key, value in args.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValueError(f"{key!r} nests under {part!r}, which already has a value")
            node = child
        if isinstance(value, dict) and isinstance(node.get(leaf), dict):
            node[leaf] = {**node[leaf], **nest_dotted(value)}
        else:
            node[leaf] = nest_dotted(value) if isinstance(value, dict) else value
    return out
