"""The report: ``summary.json``, ``report.md`` (policies side by side) and PNG plots.

Plots use matplotlib's Agg backend (no display) at a small size so they can
be committed under ``docs/``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from simulator.driver import PolicyResult

__all__ = ["CATEGORY_PLOT", "PLOTS", "write_report"]

CATEGORY_PLOT = "cost_by_category.png"

PLOTS: tuple[tuple[str, str, str], ...] = (
    ("cost_rate", "cost rate ($/h)", "cost.png"),
    ("util_cpu", "CPU utilisation (expected use / allocatable)", "utilisation_cpu.png"),
    ("util_memory", "memory utilisation", "utilisation_memory.png"),
    ("pending", "pods waiting", "pending.png"),
    ("billed_machines", "machines holding a host", "machines.png"),
)


def _row(label: str, values: Sequence[Any]) -> str:
    return "| " + label + " | " + " | ".join(str(v) for v in values) + " |"


def _floor_lines(floor: dict[str, Any] | None) -> list[str]:
    """The cost floor (``simulator.floor``) in a sentence, when the run has one."""
    if not floor or not (floor.get("pods") or floor.get("other_pods")):
        return []
    if floor.get("usd") is None:
        return [
            "",
            f"Cost floor: none — {floor['pods']} GPU pods only undeletable servers hold, one "
            f"each, reach {floor['peak_servers']} at once against {floor.get('servers', 0)} "
            "such servers: no policy places them all on arrival (`simulator/floor.py`).",
        ]
    gpu = (
        f"{floor['pods']} GPU pods only undeletable servers hold, one each, need "
        f"{floor['peak_servers']} servers at their peak at ${floor['price_per_hour']:g}/h "
        "from when each is first needed"
        if floor.get("pods")
        else "no GPU pod needs a server of its own"
    )
    # Summaries written before the second term have no ``other_usd``.
    other = (
        f"; the machines of {floor['other_pods']} pods no GPU machine holds cost at least "
        f"${floor['other_usd']:,.2f}, their reservations at the cheapest price per core or "
        "per byte of a machine able to hold them"
        if floor.get("other_pods")
        else ""
    )
    return [
        "",
        f"Cost floor: ${floor['usd']:,.2f} — no policy that places pods on arrival pays less: "
        f"{gpu}{other} (`simulator/floor.py`).",
    ]


def _markdown(meta: dict[str, Any], results: Sequence[PolicyResult]) -> str:
    names = [r.policy for r in results]
    s = [r.summary for r in results]
    lines = [
        f"# Simulation: {meta['scenario']}",
        "",
        f"{meta['description']}. Duration {meta['duration_s']:.0f} s of virtual time, "
        f"seed {meta['seed']}, fleet quota scale {meta['quota_scale']}, "
        f"{meta['shards']} shards, packing `{meta['heuristic']}`.",
        *_floor_lines(meta.get("cost_floor")),
        "",
        _row("", names),
        "|---|" + "---|" * len(names),
        _row("cost ($)", [x["cost_usd"] for x in s]),
    ]
    categories = sorted({c for x in s for c in x.get("cost_by_category_usd", {})})
    for category in categories:
        lines.append(
            _row(
                f"… {category} ($)",
                [x.get("cost_by_category_usd", {}).get(category, 0.0) for x in s],
            )
        )
    for dim in ("cpu", "memory", "gpu"):
        lines.append(_row(f"utilisation {dim}", [f"{x['utilisation'][dim]:.1%}" for x in s]))
    lines += [
        _row("unschedulable pod-minutes", [x["unschedulable_pod_minutes"] for x in s]),
        _row("… of which fragmentation", [x["fragmentation_pod_minutes"] for x in s]),
        _row("pods preempted", [x["evictions"]["preempt"] for x in s]),
        _row("pods evicted by reclaim / consolidation", [x["evictions"]["reclaim"] for x in s]),
        _row("pods evicted by spot interruptions", [x["evictions"]["interrupt"] for x in s]),
        _row("best-effort pods evicted as the gap closed", [x["evictions"]["gap"] for x in s]),
        _row("flaps (node drained < 10 min after joining)", [x["flaps"] for x in s]),
        _row(
            "gangs placed whole / arrived (pods placed / arrived)",
            [_gangs(x) for x in s],
        ),
        _row("stranded CPU (core-hours)", [x["stranded"]["cpu_core_hours"] for x in s]),
        _row("stranded memory (GiB-hours)", [x["stranded"]["memory_gib_hours"] for x in s]),
        _row("stranded GPU (GPU-hours)", [x["stranded"]["gpu_hours"] for x in s]),
        _row("wall time (s)", [x["wall_seconds"] for x in s]),
        _row("speed-up over real time", [f"{x['speedup']:.0f}×" for x in s]),
        "",
        "## Time to capacity (arrival → first placement), seconds",
        "",
        "Every pod that arrived counts; one never placed (deleted, or still waiting at the "
        "end) with its wait as long as it lasted (ADR 0175).",
        "",
        _row("priority", [f"{n} p50 / p99 (placed, never, waiting at the end)" for n in names]),
        "|---|" + "---|" * len(names),
    ]
    tiers = sorted({t for x in s for t in x["time_to_capacity"]}, key=lambda t: -int(t.lstrip("p")))
    for tier in tiers:
        cells = []
        for x in s:
            v = x["time_to_capacity"].get(tier)
            cells.append(
                "—"
                if v is None
                else f"{v['p50_s']:.0f} / {v['p99_s']:.0f} "
                f"({v['placed']}, {v['never_placed']}, {v.get('waiting_at_end', 0)})"
            )
        lines.append(_row(tier, cells))
    lines += ["", "## Plots", ""]
    for _, title, filename in PLOTS:
        lines.append(f"![{title}]({filename})")
    lines.append(f"![cost by category]({CATEGORY_PLOT})")
    lines.append("")
    return "\n".join(lines)


def _gangs(summary: Mapping[str, Any]) -> str:
    gangs = summary.get("gangs")
    if not gangs or not gangs.get("total"):
        return "—"
    return f"{gangs['placed_whole']} / {gangs['total']} ({gangs['pods_placed']} / {gangs['pods']})"


def _plot(results: Sequence[PolicyResult], key: str, title: str, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 2.6), dpi=80)
    for result in results:
        t = [x / 3600.0 for x in result.series.get("t", [])]
        ax.plot(t, result.series.get(key, []), label=result.policy, linewidth=1.2)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("hours", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _plot_categories(results: Sequence[PolicyResult], path: Path) -> None:
    """Stacked bars: each policy's dollars by cost category (what the money went on)."""
    totals = [r.summary.get("cost_by_category_usd", {}) for r in results]
    categories = sorted({c for t in totals for c in t})
    fig, ax = plt.subplots(figsize=(7, 2.8), dpi=80)
    names = [r.policy for r in results]
    bottom = [0.0] * len(results)
    for category in categories:
        values = [t.get(category, 0.0) for t in totals]
        ax.barh(names, values, left=bottom, label=category)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_title("cost by category ($ over the run)", fontsize=10)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_report(out: Path, meta: dict[str, Any], results: Sequence[PolicyResult]) -> Path:
    """Write summary.json, report.md and the plots into ``out``; returns report.md's path."""
    out.mkdir(parents=True, exist_ok=True)
    summary = {"run": meta, "policies": {r.policy: r.summary for r in results}}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    for key, title, filename in PLOTS:
        _plot(results, key, title, out / filename)
    _plot_categories(results, out / CATEGORY_PLOT)
    report = out / "report.md"
    report.write_text(_markdown(meta, results))
    return report
