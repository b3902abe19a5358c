"""The graph on a local multi-node Ray cluster shaped like ``k8s/overlays/cpu``:
the Ray autoscaler's timeline under a ramp, then a soak.

    python -m bench.multinode --out docs/multinode.md

The cluster (``bench/harness/cluster.py``): a head with ``num-cpus 0``, the
overlay's node groups as the autoscaler's node types (autoscaler v2, fake
multi-node provider), the overlay's ``serveConfigV2`` deployed through the
head's dashboard.

- **ramp**: open-loop streamed chat (tier text, ``ignore_eos``) at ``--ramp``
  phases; every second, Ray's state API gives alive nodes per node group and
  Serve replicas per deployment. After the load, sampling goes on until
  Derender and the CPU nodes are back at their minimum (or ``--settle-s``).
- **soak**: ``--soak-minutes`` of mixed traffic at ``--soak-rps`` (streamed
  and unary chat, streamed completions; 5% of requests cancelled by the
  client after their first event, 5% aborted through ``abort_requests``).
  Every ``--sample-s``: the RSS of every replica's process tree (a Generate
  replica's includes its engine) and the engines' running + waiting requests.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import threading
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.arrivals import arrival_times, parse_ramp
from bench.cli import reproducing_command
from bench.harness.cluster import (
    LocalCluster,
    deploy_rayservice,
    local_cluster,
    set_client_env,
)
from bench.harness.cluster_load import TIER, OpenLoop, Timeline, engine_requests, outcome
from bench.harness.cluster_shape import ClusterShape
from bench.harness.kustomize import on_shared_host, overlay
from bench.harness.sse_reader import Stream
from bench.multinode.report import write
from bench.multinode.results import CPU_GROUP, RampResult, SoakResult

SOAK_KINDS = {"stream": 0.6, "unary": 0.2, "completion": 0.1, "cancel": 0.05, "abort": 0.05}


def run_ramp(cluster: LocalCluster, base_url: str, model: str, args: Any) -> RampResult:
    phases = parse_ramp(args.ramp)
    timeline = Timeline(cluster)
    load = OpenLoop(base_url, model, phases, max_tokens=args.max_tokens, seed=args.seed)
    load.start()
    timeline.start(load.started_at)
    load.join(sum(p.seconds for p in phases) + 600)
    load_end = time.monotonic() - load.started_at
    deadline = time.monotonic() + args.settle_s
    first = timeline.samples[0] if timeline.samples else None
    while time.monotonic() < deadline:
        time.sleep(2)
        last = timeline.samples[-1] if timeline.samples else None
        if first and last and last.t > load_end + 10 and _at_minimum(first, last):
            break
    time.sleep(5)
    timeline.stop()
    return RampResult(
        ramp=args.ramp,
        samples=[asdict(s) for s in timeline.samples],
        sent_s=[s.sent_at - load.started_at for s in load.sent],
        outcomes=dict(Counter(outcome(s.stream) for s in load.sent)),
        load_end_s=load_end,
    )


def _at_minimum(first: Any, last: Any) -> bool:
    derender = sum(last.replicas.get("Derender", {}).values())
    return derender == 1 and last.nodes.get(CPU_GROUP) == first.nodes.get(CPU_GROUP)


def _request(base_url: str, model: str, kind: str, rng: random.Random) -> Stream:
    tokens = rng.randint(32, 256)
    if kind == "completion":
        body: dict[str, Any] = {"model": model, "prompt": "Once upon a time", "stream": True}
        path = "/v1/completions"
    else:
        content = f"Tell me about the number {rng.randint(0, 10**6)}."
        body = {"model": model, "messages": [{"role": "user", "content": content}]}
        body["stream"] = kind != "unary"
        path = "/v1/chat/completions"
    body.update(max_tokens=tokens, ignore_eos=True)
    if body["stream"]:
        body["stream_options"] = {"include_usage": True}
    return Stream(base_url, path, body, TIER)


def _unary_outcome(stream: Stream) -> str:
    if stream.error:
        return f"broken: {stream.error}"
    try:
        data = json.loads(stream.body)
    except json.JSONDecodeError:
        return f"broken: not JSON: {stream.body[:200]}"
    return "ok" if data.get("choices") else f"broken: {stream.body[:200]}"


def _cancel(stream: Stream) -> None:
    stream.wait_first(60)
    stream.kill()


def _abort(base_url: str, stream: Stream) -> None:
    if stream.wait_first(60) and stream.events:
        with_id = stream.stream_id
        httpx.post(
            f"{base_url}/inference/v1/abort_requests", json={"request_ids": [with_id]}, timeout=30
        )


def _rss(cluster: LocalCluster) -> dict[str, float]:
    """RSS MiB of each replica's process tree."""
    out = {}
    for replica in cluster.replicas():
        try:
            proc = psutil.Process(replica["pid"])
            total = proc.memory_info().rss + sum(
                c.memory_info().rss for c in proc.children(recursive=True)
            )
        except psutil.Error:
            continue
        out[f"{replica['deployment']}/{replica['replica']}"] = total / 2**20
    return out


def run_soak(cluster: LocalCluster, base_url: str, model: str, args: Any) -> SoakResult:
    result = SoakResult(minutes=args.soak_minutes, rps=args.soak_rps)
    rng = random.Random(args.seed + 1)
    seconds = args.soak_minutes * 60
    times = arrival_times(parse_ramp(f"{args.soak_rps}:{seconds}"), poisson=True, seed=args.seed)
    kinds, weights = zip(*SOAK_KINDS.items(), strict=True)
    sent: list[tuple[str, Stream]] = []
    actions: list[threading.Thread] = []
    start = time.monotonic()
    next_sample = 0.0
    for at in [*times, seconds]:
        while True:
            now = time.monotonic() - start
            if now >= next_sample:
                minute = now / 60
                for replica, mib in _rss(cluster).items():
                    result.rss.setdefault(replica, []).append((minute, mib))
                result.engine_requests.append((minute, engine_requests(base_url)))
                next_sample += args.sample_s
            if now >= at:
                break
            time.sleep(min(at - now, max(0.0, next_sample - now), 0.5))
        if at == seconds:
            break
        kind = rng.choices(kinds, weights)[0]
        stream = _request(base_url, model, kind, rng)
        stream.start()
        sent.append((kind, stream))
        if kind in ("cancel", "abort"):
            act = _cancel if kind == "cancel" else lambda s: _abort(base_url, s)
            thread = threading.Thread(target=act, args=(stream,), daemon=True)
            thread.start()
            actions.append(thread)
    for thread in actions:
        thread.join(120)
    for _, stream in sent:
        stream.join(300)
    ended = time.monotonic()
    while time.monotonic() - ended < 120:
        if engine_requests(base_url) == 0:
            result.engine_requests_after_s = time.monotonic() - ended
            break
        time.sleep(1)
    minute = (time.monotonic() - start) / 60
    for replica, mib in _rss(cluster).items():
        result.rss.setdefault(replica, []).append((minute, mib))
    for kind, stream in sent:
        result.kinds[kind] = result.kinds.get(kind, 0) + 1
        if kind == "cancel":
            got = "cancelled"
        elif kind == "unary":
            got = _unary_outcome(stream)
        else:
            got = outcome(stream)
        by_kind = result.outcomes.setdefault(kind, {})
        by_kind[got] = by_kind.get(got, 0) + 1
        expected = {"ok", "aborted"} if kind == "abort" else {"ok", "cancelled"}
        if got not in expected:
            result.failures.append(f"{kind}: {got}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ramp", default="0.5:30,3:150,0.5:60")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--settle-s", type=float, default=300)
    parser.add_argument("--soak-minutes", type=float, default=20)
    parser.add_argument("--soak-rps", type=float, default=1.0)
    parser.add_argument("--sample-s", type=float, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-multinode"))
    parser.add_argument("--out", type=Path, default=Path("docs/multinode.md"))
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    args.host = f"{platform.machine()}, {psutil.cpu_count()} CPUs"
    saved = args.work / "results.json"
    if args.report_only:
        data = json.loads(saved.read_text())
        ramp = RampResult(**data["ramp"])
        soak = SoakResult(**data["soak"]) if data.get("soak") else None
        shape = data["shape"]
    else:
        set_client_env()
        rayservice = on_shared_host(overlay("cpu"))
        cluster_shape = ClusterShape.of(rayservice)
        shape = asdict(cluster_shape)
        with local_cluster(cluster_shape, args.work) as cluster:
            base_url = deploy_rayservice(cluster, rayservice)
            model = httpx.get(f"{base_url}/v1/models", timeout=30).json()["data"][0]["id"]
            ramp = run_ramp(cluster, base_url, model, args)
            print(f"ramp: {ramp.outcomes}", flush=True)
            soak = run_soak(cluster, base_url, model, args) if args.soak_minutes > 0 else None
        args.work.mkdir(parents=True, exist_ok=True)
        saved.write_text(
            json.dumps(
                {"ramp": asdict(ramp), "soak": asdict(soak) if soak else None, "shape": shape}
            )
        )
    command = reproducing_command("bench.multinode", parser, args)
    write(ramp, soak, shape, args, command, args.out)
    print(args.out.read_text())
