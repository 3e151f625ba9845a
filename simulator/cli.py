"""``bigfleet simulate``: replay a scenario or a trace under each policy and write the report."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from clusters.packing import DEFAULT_HEURISTIC, Heuristic
from simulator.driver import POLICIES, Progress, RunOptions, simulate
from simulator.engines import default_workers
from simulator.floor import fleet_floor
from simulator.scenarios import SCENARIOS, TIER_NAMES, build
from simulator.seeds import compare, markdown, parse_seeds, to_json
from simulator.trace import TraceError, dump_trace, load_trace

__all__ = ["parse_duration", "simulate_command"]

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``6h``, ``1d`` → seconds; ``ValueError`` otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not match:
        raise ValueError(f"duration: expected a number with s, m, h or d, got {text!r}")
    value = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if value <= 0:
        raise ValueError("duration: must be positive")
    return value


def _progress_factory(enabled: bool, duration: float) -> Callable[[str], Progress | None] | None:
    if not enabled:
        return None
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as Bar

    bar = Bar(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}% of virtual time"),
        TimeElapsedColumn(),
        transient=False,
    )
    bar.start()

    def factory(policy: str) -> Progress:
        task = bar.add_task(policy, total=duration)

        def update(now: float) -> None:
            bar.update(task, completed=min(now, duration))
            if now >= duration - 60:
                bar.update(task, completed=duration)

        return update

    import atexit

    atexit.register(bar.stop)
    return factory


def simulate_command(
    out: Annotated[Path, typer.Option(help="Directory for summary.json, report.md, plots.")],
    scenario: Annotated[
        str, typer.Option(help=f"Built-in scenario: {', '.join(SCENARIOS)}.")
    ] = "mixed",
    trace: Annotated[
        Path | None, typer.Option(help="Replay this JSON-lines trace instead of a scenario.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seeds the scenario and the providers.")] = 1,
    clusters: Annotated[int, typer.Option(min=1, help="Clusters in the scenario.")] = 12,
    duration: Annotated[str, typer.Option(help="Virtual time: 90s, 15m, 6h, 1d.")] = "1d",
    scale: Annotated[float, typer.Option(help="Pods per cluster, relative.")] = 1.0,
    quota_scale: Annotated[
        float | None, typer.Option(help="Fleet size as a multiple of the shipped catalogs.")
    ] = None,
    shards: Annotated[int, typer.Option(min=1, help="Shard engines (BigFleet policy).")] = 2,
    workers: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Processes running the engines (1: none; default one per core, at most one "
            "per shard). Results do not depend on it.",
        ),
    ] = None,
    heuristic: Annotated[
        str, typer.Option(help="Packing: ffd-sum, ffd-avg, ffd-prod, dot-product, l2.")
    ] = DEFAULT_HEURISTIC.value,
    policy: Annotated[
        list[str] | None, typer.Option(help=f"Policies to run (repeat): {', '.join(POLICIES)}.")
    ] = None,
    cycle_interval: Annotated[float, typer.Option(help="Seconds between engine cycles.")] = 10.0,
    early_report_gap: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="A shard with news for the coordinator reports this soon after its last "
            "report (ADR 0184); 30 or more: only every 30 s.",
        ),
    ] = 10.0,
    progress: Annotated[
        bool | None, typer.Option("--progress/--no-progress", help="Progress bar (TTY default).")
    ] = None,
    write_trace: Annotated[
        Path | None, typer.Option(help="Also write the scenario's trace to this file.")
    ] = None,
    seeds: Annotated[
        str | None,
        typer.Option(
            help="Run each of these seeds (1-5, 1,3,5) into OUT/seed-<s>/ and compare them in "
            "OUT/seeds.md (mean, min, max, every seed, the goals each misses).",
        ),
    ] = None,
) -> None:
    """Replay demand under BigFleet and a per-cluster baseline; write the comparison."""
    if seeds is not None:
        _simulate_seeds(
            seeds,
            out=out,
            one=lambda seed, where: simulate_command(
                out=where,
                scenario=scenario,
                trace=trace,
                seed=seed,
                clusters=clusters,
                duration=duration,
                scale=scale,
                quota_scale=quota_scale,
                shards=shards,
                workers=workers,
                heuristic=heuristic,
                policy=policy,
                cycle_interval=cycle_interval,
                early_report_gap=early_report_gap,
                progress=progress,
                write_trace=None,
            ),
            scenario=scenario if trace is None else trace.name,
            write_trace=write_trace,
        )
        return
    try:
        seconds = parse_duration(duration)
        chosen = Heuristic.parse(heuristic)
        policies = policy or list(POLICIES)
        for name in policies:
            if name not in POLICIES:
                raise ValueError(f"policy: unknown {name!r}; choose from {', '.join(POLICIES)}")
        if trace is not None:
            replay = load_trace(trace)
            name, fleet_scale = trace.name, quota_scale if quota_scale is not None else 1.0
        else:
            built = build(
                scenario,
                clusters=clusters,
                duration=seconds,
                seed=seed,
                scale=scale,
                quota_scale=quota_scale,
            )
            replay, name, fleet_scale = built.trace, scenario, built.quota_scale
    except (ValueError, TraceError, OSError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    if write_trace is not None:
        dump_trace(replay, write_trace)
    options = RunOptions(
        quota_scale=fleet_scale,
        seed=seed,
        shards=shards,
        heuristic=chosen,
        cycle_interval_s=cycle_interval,
        early_report_gap_s=early_report_gap,
        workers=workers if workers is not None else default_workers(shards),
    )
    show = sys.stderr.isatty() if progress is None else progress
    started = time.perf_counter()
    results = simulate(
        replay, options, policies=policies, progress=_progress_factory(show, replay.duration)
    )
    meta: dict[str, Any] = {
        "scenario": name,
        "description": replay.description or name,
        "duration_s": replay.duration,
        "events": len(replay.events),
        "clusters": len(replay.clusters),
        "seed": seed,
        "quota_scale": fleet_scale,
        "shards": shards,
        "workers": options.workers,
        "heuristic": chosen.value,
        "wall_seconds": round(time.perf_counter() - started, 2),
        "cost_floor": fleet_floor(replay, quota_scale=fleet_scale, seed=seed).to_json(),
    }
    # matplotlib is imported only when a report is written, not by every `bigfleet` command.
    from simulator.report import write_report

    report = write_report(out, meta, results)
    for result in results:
        s = result.summary
        typer.echo(
            f"{result.policy:>16}: ${s['cost_usd']:>10,.2f}  cpu {s['utilisation']['cpu']:.1%}  "
            f"unschedulable {s['unschedulable_pod_minutes']:,.0f} pod-min  "
            f"{s['speedup']:,.0f}× real time"
        )
    typer.echo(f"report: {report}")


def _simulate_seeds(
    text: str,
    *,
    out: Path,
    one: Callable[[int, Path], None],
    scenario: str,
    write_trace: Path | None,
) -> None:
    """Each seed into ``out/seed-<s>/``, then ``seeds.md`` and ``seeds.json`` beside them."""
    try:
        chosen = parse_seeds(text)
        if write_trace is not None:
            raise ValueError("write-trace: one trace per seed; use --seed to write one")
    except ValueError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    runs: dict[int, dict[str, Any]] = {}
    floors: dict[int, float] = {}
    for seed in chosen:
        where = out / f"seed-{seed}"
        typer.echo(f"seed {seed}:")
        one(seed, where)
        summary = json.loads((where / "summary.json").read_text())
        runs[seed] = summary["policies"]
        floor = summary.get("run", {}).get("cost_floor") or {}
        if floor.get("usd") is not None:
            floors[seed] = float(floor["usd"])
    policies = set.intersection(*(set(r) for r in runs.values()))
    if not {"bigfleet", "baseline"} <= policies:
        typer.echo("seeds: no comparison (it needs both the bigfleet and baseline policies)")
        return
    figures = compare(runs, tier_names=TIER_NAMES.get(scenario), floors=floors)
    (out / "seeds.json").write_text(to_json(figures, chosen) + "\n")
    table = markdown(figures, chosen)
    (out / "seeds.md").write_text(
        f"# {scenario}: bigfleet against the per-cluster baseline, seeds {text}\n\n{table}"
    )
    typer.echo(table)
    typer.echo(f"seeds: {out / 'seeds.md'}")
