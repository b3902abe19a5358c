"""docs/multinode.md from a ``bench.multinode`` run: the ramp's timeline (table and
plot) and the soak's figures (RSS slope per replica, failures, engine requests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.multinode.results import CPU_GROUP, RampResult, SoakResult


def slope_per_minute(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (minute, value) points; None under two points."""
    if len(points) < 2:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((x - mean_x) ** 2 for x, _ in points)
    if var == 0:
        return None
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / var


def second_half(points: list[tuple[float, float]], minutes: float) -> list[tuple[float, float]]:
    return [(x, y) for x, y in points if x >= minutes / 2]


def _replicas(sample: dict[str, Any], deployment: str) -> int:
    return sum(sample["replicas"].get(deployment, {}).values())


def timeline_rows(ramp: RampResult) -> list[str]:
    """One row per change of nodes or replicas."""
    out = [
        "| t s | requests sent in the last 10 s | CPU nodes | engine nodes | Derender | Render "
        "| Derender on added nodes |",
        "|---|---|---|---|---|---|---|",
    ]
    last: tuple[int, ...] | None = None
    for sample in ramp.samples:
        t = sample["t"]
        key = (
            sample["nodes"].get(CPU_GROUP, 0),
            sample["nodes"].get("engine", 0),
            _replicas(sample, "Derender"),
            _replicas(sample, "Render"),
        )
        if key == last:
            continue
        last = key
        recent = sum(1 for s in ramp.sent_s if t - 10 <= s < t)
        added = sample["replicas"].get("Derender", {}).get(CPU_GROUP, 0)
        out.append(
            f"| {t:.0f} | {recent} | {key[0]} | {key[1]} | {key[2]} | {key[3]} | "
            f"{max(0, added - 1)} |"
        )
    return out


def plot(ramp: RampResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t"] for s in ramp.samples]
    fig, (load_ax, ax) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    bins = range(0, int(max(t + ramp.sent_s + [1])) + 10, 10)
    load_ax.hist(ramp.sent_s, bins=list(bins), color="0.6")
    load_ax.set_ylabel("requests sent / 10 s")
    load_ax.axvline(ramp.load_end_s, color="k", lw=0.8, ls=":")
    ax.step(t, [s["nodes"].get(CPU_GROUP, 0) for s in ramp.samples], where="post",
            label="CPU nodes (Ray)", lw=2)  # fmt: skip
    ax.step(t, [_replicas(s, "Derender") for s in ramp.samples], where="post",
            label="Derender replicas (Serve)")  # fmt: skip
    ax.step(t, [_replicas(s, "Render") for s in ramp.samples], where="post",
            label="Render replicas (Serve)", ls="--")  # fmt: skip
    ax.axvline(ramp.load_end_s, color="k", lw=0.8, ls=":", label="last request ended")
    ax.set_xlabel("seconds from the first request")
    ax.set_ylabel("count")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def soak_rows(soak: SoakResult) -> list[str]:
    out = [
        "| replica | RSS first MiB | RSS last MiB | slope, second half, MiB/min |",
        "|---|---|---|---|",
    ]
    for replica, points in sorted(soak.rss.items()):
        slope = slope_per_minute(second_half(points, soak.minutes))
        out.append(
            f"| {replica} | {points[0][1]:.0f} | {points[-1][1]:.0f} | "
            f"{'–' if slope is None else f'{slope:+.2f}'} |"
        )
    return out


def write(
    ramp: RampResult,
    soak: SoakResult | None,
    shape: dict[str, Any],
    args: Any,
    command: str,
    out: Path,
) -> None:
    image = out.with_suffix(".png")
    plot(ramp, image)
    groups = ", ".join(
        f"`{g['name']}` ({', '.join(f'{k} {v:g}' for k, v in g['resources'].items())}; "
        f"{g['min_nodes']}–{g['max_nodes']} nodes)"
        for g in shape["groups"]
    )
    text = [
        "# The graph on a multi-node Ray cluster",
        "",
        f"`{command}`",
        "",
        f"Host: {args.host}, one machine. A local Ray cluster shaped like "
        "`k8s/overlays/cpu` (`bench/harness/cluster.py`): a head with "
        f"{shape['head_cpus']:g} CPUs, node groups {groups}, idle nodes removed after "
        f"{shape['idle_timeout_s']:g} s. The Ray autoscaler (v2) adds and removes worker "
        "nodes through its fake multi-node provider: each node is a real raylet on this "
        "machine. The overlay's `serveConfigV2` (`configs/cluster.yaml`, topology S) is "
        "deployed through the head's dashboard, as the KubeRay operator does. Every node "
        "shares this machine's 2 cores, so the figures below are about placement, scaling "
        "and failures, not speed.",
        "",
        "The faults (a CPU node's raylet killed mid-stream, the Serve controller killed, the "
        "Generate replica killed) are tests: `make test-cluster` runs them all, `make test` "
        "all but the Generate replica's (`tests/cluster/test_cluster.py`).",
        "",
        "## Ramp: the autoscaler adds a CPU node for Derender and removes it",
        "",
        f"Open-loop streamed chat (tier text, {args.max_tokens} tokens each, `ignore_eos`) at "
        f"`--ramp {ramp.ramp}` (requests per second : seconds). Outcomes: "
        + ", ".join(f"{k} {v}" for k, v in sorted(ramp.outcomes.items()))
        + ". Alive nodes and Serve replicas from Ray's state API every second; a row per "
        "change.",
        "",
        *timeline_rows(ramp),
        "",
        f"![nodes and replicas over time]({image.name})",
        "",
    ]
    if soak is not None:
        rss_slopes = [
            s
            for points in soak.rss.values()
            if (s := slope_per_minute(second_half(points, soak.minutes))) is not None
        ]
        text += [
            "## Soak",
            "",
            f"{soak.minutes:g} minutes at {soak.rps:g} req/s, Poisson, against the same "
            "cluster after the ramp: "
            + ", ".join(f"{k} {v}" for k, v in sorted(soak.kinds.items()))
            + " (*cancel*: the client drops the connection after the first event; *abort*: "
            "`/inference/v1/abort_requests` with the stream's id after the first event).",
            "",
            "| outcome by kind | |",
            "|---|---|",
            *[
                f"| {kind} | {', '.join(f'{o} {n}' for o, n in sorted(got.items()))} |"
                for kind, got in sorted(soak.outcomes.items())
            ],
            "",
            f"- Failures (a request not completed, aborted or cancelled as asked): "
            f"**{len(soak.failures)}**"
            + (f" ({'; '.join(soak.failures[:5])})" if soak.failures else "")
            + ".",
            "- Engine requests (running + waiting) after the last request ended: "
            + (
                f"0 after {soak.engine_requests_after_s:.0f} s."
                if soak.engine_requests_after_s is not None
                else "**never 0 within 120 s**."
            ),
            f"- RSS slope over the second half, largest: "
            f"{max(rss_slopes, default=0.0):+.2f} MiB/min.",
            "",
            *soak_rows(soak),
            "",
        ]
    out.write_text("\n".join(text))
