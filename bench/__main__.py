"""The experiment CLI.

    python -m bench run --topologies G,T,B,BP,S,I --shapes chat,tools,reasoning \\
        --rps 0.5,2,6 --duration 300 --out results/gpu
    python -m bench run ... --ramp 0.5:30,3:60,0.5:60 --topologies S   # autoscaling
    python -m bench report results/gpu                                # redraw

``--length-scale`` and ``--rate-scale`` shrink the seed's output lengths and
rates for a CPU engine; the report states both.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.arrivals import parse_ramp
from bench.clients import CLIENTS
from bench.experiment import GridSpec, run_grid
from bench.report import write_report
from bench.shapes import SHAPES
from bench.topology import CONFIGS
from deployments.config.graph_config import TINY_MODEL
from deployments.config.topologies import app_config

DEFAULT_MODEL = str(TINY_MODEL)


def _list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def parser() -> argparse.ArgumentParser:
    cli = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[1])
    sub = cli.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the grid (or a ramp) and write the report")
    run.add_argument("--topologies", default="G,T,B,BP,S,I")
    run.add_argument("--shapes", default=",".join(SHAPES))
    run.add_argument("--rps", default="0.5,2,6", help="the seed's rates, before --rate-scale")
    run.add_argument("--duration", type=float, default=300, help="seconds of arrivals per cell")
    run.add_argument("--drain", type=float, default=None, help="seconds after the last arrival")
    run.add_argument("--length-scale", type=float, default=1.0)
    run.add_argument("--rate-scale", type=float, default=1.0)
    run.add_argument("--arrivals", choices=["poisson", "constant"], default="poisson")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument(
        "--profile",
        choices=["local", "gpu"],
        default="local",
        help="local: configs/<T>.yaml; gpu: configs/gpu.yaml with T's switches",
    )
    run.add_argument("--model", default=None, help="the served model (default: the profile's)")
    run.add_argument("--url", default=None, help="use this running graph for every topology")
    run.add_argument("--kv-cache-gib", type=float, default=None)
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a graph arg over each config's, e.g. generate.num_cpus=0.5",
    )
    run.add_argument("--ramp", default=None, help="phases rps:seconds,... (rates as run)")
    run.add_argument("--out", type=Path, required=True)
    report = sub.add_parser("report", help="rewrite the table and plots of a results dir")
    report.add_argument("out", type=Path)
    return cli


def served_model(profile: str) -> str:
    """The model a profile serves: configs/gpu.yaml's, or the embedded tiny model."""
    if profile == "gpu":
        return str(app_config(CONFIGS / "gpu.yaml")["args"]["model"])
    return DEFAULT_MODEL


def spec_from(args: argparse.Namespace) -> GridSpec:
    topologies, shapes = _list(args.topologies), _list(args.shapes)
    unknown = [t for t in topologies if t not in CLIENTS] + [s for s in shapes if s not in SHAPES]
    if unknown:
        raise SystemExit(f"unknown topology or shape: {', '.join(unknown)}")
    if bad := [item for item in args.set if "=" not in item]:
        raise SystemExit(f"--set takes KEY=VALUE, got: {', '.join(bad)}")
    ramp = parse_ramp(args.ramp) if args.ramp else []
    rps = (
        [max(p.rps for p in ramp)]
        if ramp
        else [round(float(r) * args.rate_scale, 4) for r in _list(args.rps)]
    )
    duration = sum(p.seconds for p in ramp) if ramp else args.duration
    return GridSpec(
        topologies=topologies,
        shapes=shapes,
        rps=rps,
        duration_s=duration,
        drain_s=args.drain if args.drain is not None else max(60.0, duration),
        length_scale=args.length_scale,
        rate_scale=args.rate_scale,
        poisson=args.arrivals == "poisson",
        seed=args.seed,
        model=args.model or served_model(args.profile),
        profile=args.profile,
        url=args.url,
        kv_cache_gib=args.kv_cache_gib,
        set_args=dict(item.split("=", 1) for item in args.set),
        ramp=ramp,
    )


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "run":
        run_grid(spec_from(args), args.out)
    print(write_report(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
