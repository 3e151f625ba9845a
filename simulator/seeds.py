"""Several seeds of one scenario, compared: the table a decision change is judged by.

    bigfleet simulate --seeds 1-5 ...  ──▶ DIR/seed-<s>/ (each seed's own report)
                                        └▶ DIR/seeds.md, DIR/seeds.json (this module)

One seed is an anecdote: a change is judged by every figure a user feels,
over several seeds, as mean, min and max, and seed by seed (a mean can hide
the one seed that got worse). :func:`compare` builds that table from the
runs' summaries; each figure also carries the goal it is held to, and the
seeds at which the candidate misses it, so a regression names itself.

The goals are those the project holds BigFleet to against the per-cluster
baseline (issue 18): cost at most 0.85× the baseline's; unschedulable
pod-minutes and pods never placed (gone before they ran; a pod the replay's
end finds waiting is counted beside them, its wait so far in the p99s,
ADR 0175) at most the baseline's; at every priority
tier, p99 time to capacity at most the baseline's + 30 s; no flaps; every
gang the baseline places whole, placed whole too (compared gang by gang).

Where the runs know their cost floor (``simulator.floor``: what no policy
that places pods on arrival can pay less than), the table shows it against
the baseline and names the seeds at which the cost goal lies below it.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "COST_GOAL",
    "P99_SLACK_S",
    "Figure",
    "compare",
    "markdown",
    "parse_seeds",
    "to_json",
]

#: Cost of the candidate at most this multiple of the reference's.
COST_GOAL = 0.85
#: p99 time to capacity of a tier at most the reference's plus this (seconds).
P99_SLACK_S = 30.0
#: The figures shown as ratios to the reference (one column of multiples).
_RATIOS = ("cost vs baseline", "cost floor vs baseline")

Summary = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Figure:
    """One figure over the seeds: the candidate's and the reference's value per seed."""

    label: str
    candidate: tuple[float, ...]
    reference: tuple[float, ...]
    #: What the candidate is held to, in words ("" when the figure has no goal).
    goal: str
    #: Seeds (in order) at which the candidate misses its goal.
    missed: tuple[int, ...]


def parse_seeds(text: str) -> tuple[int, ...]:
    """``1-5``, ``1,3,5``, ``2`` or ``1-3,7`` → the seeds in order; ``ValueError`` otherwise."""
    seeds: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not match:
            raise ValueError(f"seeds: expected numbers and ranges like 1-5,7; got {text!r}")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise ValueError(f"seeds: range {part.strip()!r} runs backwards")
        seeds.extend(range(first, last + 1))
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds: {text!r} names a seed twice")
    if len(seeds) > 100:
        raise ValueError(f"seeds: {len(seeds)} seeds; at most 100")
    return tuple(seeds)


def _tiers(runs: Sequence[Summary]) -> list[int]:
    """Every priority that placed or waited for a pod in any run, highest first."""
    found = {int(k[1:]) for run in runs for k in run.get("time_to_capacity", {})}
    return sorted(found, reverse=True)


def _p99(summary: Summary, priority: int) -> float:
    tier = summary.get("time_to_capacity", {}).get(f"p{priority}")
    return float(tier["p99_s"]) if tier and tier.get("p99_s") is not None else 0.0


def _tier_p99(priority: int) -> Callable[[Summary], float]:
    return lambda summary: _p99(summary, priority)


def compare(
    runs: Mapping[int, Mapping[str, Summary]],
    *,
    candidate: str = "bigfleet",
    reference: str = "baseline",
    tier_names: Mapping[int, str] | None = None,
    floors: Mapping[int, float] | None = None,
) -> list[Figure]:
    """The figures of ``candidate`` against ``reference`` over the seeds of ``runs``.

    ``runs`` maps each seed to its summaries by policy (``summary.json``'s
    ``policies``). Both policies must have run at every seed. ``floors``,
    the cost floor of each seed in dollars, adds a row of floor ÷ the
    reference's cost when every seed has one.
    """
    if not runs:
        raise ValueError("runs: no seeds to compare")
    seeds = list(runs)
    for seed, by_policy in runs.items():
        for policy in (candidate, reference):
            if policy not in by_policy:
                raise ValueError(f"runs: seed {seed} has no run of policy {policy!r}")
    cand = [runs[s][candidate] for s in seeds]
    ref = [runs[s][reference] for s in seeds]
    names = tier_names or {}

    def figure(
        label: str,
        value: Callable[[Summary], float],
        goal: str = "",
        meets: Callable[[float, float], bool] | None = None,
    ) -> Figure:
        c = tuple(value(x) for x in cand)
        r = tuple(value(x) for x in ref)
        missed = (
            ()
            if meets is None
            else tuple(s for s, a, b in zip(seeds, c, r, strict=True) if not meets(a, b))
        )
        return Figure(label, c, r, goal, missed)

    costs = [(float(c["cost_usd"]), float(r["cost_usd"])) for c, r in zip(cand, ref, strict=True)]
    ratios = tuple(c / r if r > 0 else 0.0 for c, r in costs)
    figures = [
        Figure(
            "cost vs baseline",
            ratios,
            tuple(1.0 for _ in ref),
            f"≤ {COST_GOAL}×",
            tuple(s for s, x in zip(seeds, ratios, strict=True) if x > COST_GOAL + 1e-9),
        ),
    ]
    if floors is not None and all(seed in floors for seed in seeds):
        figures.append(
            Figure(
                "cost floor vs baseline",
                tuple(
                    floors[s] / r if r > 0 else 0.0 for s, (_, r) in zip(seeds, costs, strict=True)
                ),
                tuple(1.0 for _ in ref),
                "",
                (),
            )
        )
    figures += [
        figure("cost ($)", lambda x: float(x["cost_usd"])),
        figure(
            "unschedulable pod-minutes",
            lambda x: float(x["unschedulable_pod_minutes"]),
            "≤ baseline",
            lambda a, b: a <= b,
        ),
        figure(
            "pods never placed",
            lambda x: float(sum(t["never_placed"] for t in x.get("time_to_capacity", {}).values())),
            "≤ baseline",
            lambda a, b: a <= b,
        ),
        # Still waiting when the replay ended (ADR 0175): their waits so far are in the
        # p99 rows below; summaries from before the split counted them as never placed.
        figure(
            "pods waiting when the run ended",
            lambda x: float(
                sum(t.get("waiting_at_end", 0) for t in x.get("time_to_capacity", {}).values())
            ),
        ),
        figure("flaps", lambda x: float(x["flaps"]), "0", lambda a, _b: a == 0),
    ]
    if all("gangs" in x for x in (*cand, *ref)):
        figures += _gang_figures(seeds, cand, ref)
    for priority in _tiers([*cand, *ref]):
        name = names.get(priority, f"priority {priority:,}")
        figures.append(
            figure(
                f"{name} p99 (s)",
                _tier_p99(priority),
                f"≤ baseline + {P99_SLACK_S:.0f} s",
                lambda a, b: a <= b + P99_SLACK_S,
            )
        )
    return figures


def _gang_figures(
    seeds: Sequence[int], cand: Sequence[Summary], ref: Sequence[Summary]
) -> list[Figure]:
    """Gang pods placed, gangs placed whole, and those one policy placed whole and the other not.

    The last is the goal "every gang the baseline places, BigFleet places",
    checked gang by gang (the same trace gives both runs the same gangs):
    each side's value is how many gangs the *other* placed whole and it did
    not, so the candidate is held to 0. Where gangs of one priority wait for
    the same racks, which of them starts first is a matter of order, and
    the count of gangs placed whole (held to at least the baseline's) says
    whether the fleet served as many.

    A gang one side placed whole and the other had not when the replay
    ended, having waited no longer than the first side took to place it
    plus the tail goals' slack, is undecided (ADR 0182): the replay stopped
    before the other side could be late. It is not a miss of either goal
    (the count goal compares the gangs placed whole less the undecided
    ones; the counts shown are every gang placed whole), and its own row
    shows how many there were. Summaries written before ADR 0182 carry no
    times, so none of their gangs is undecided.
    """

    def whole(summary: Summary) -> set[str]:
        return set(summary["gangs"].get("whole", ()))

    def undecided(late: Summary, placed: Summary) -> set[str]:
        """Gangs ``placed`` placed whole that ``late`` was still waiting for, within the slack.

        ``cut_off_s`` holds only gangs not placed whole (``Recorder.summary``).
        """
        took: dict[str, float] = placed["gangs"].get("whole_s", {})
        cut: dict[str, float] = late["gangs"].get("cut_off_s", {})
        return {g for g, waited in cut.items() if g in took and waited <= took[g] + P99_SLACK_S}

    cut_c = [undecided(c, r) for c, r in zip(cand, ref, strict=True)]
    cut_r = [undecided(r, c) for c, r in zip(cand, ref, strict=True)]
    open_ = [a | b for a, b in zip(cut_c, cut_r, strict=True)]
    missed_by_cand = tuple(
        float(len(whole(r) - whole(c) - u)) for c, r, u in zip(cand, ref, open_, strict=True)
    )
    missed_by_ref = tuple(
        float(len(whole(c) - whole(r) - u)) for c, r, u in zip(cand, ref, open_, strict=True)
    )
    placed_c = tuple(float(len(whole(c))) for c in cand)
    placed_r = tuple(float(len(whole(r))) for r in ref)
    # The count goal compares the gangs the replay decided.
    fewer = tuple(
        s
        for s, c, r, u in zip(seeds, cand, ref, open_, strict=True)
        if len(whole(c) - u) < len(whole(r) - u)
    )
    return [
        Figure(
            "gang pods placed",
            tuple(float(c["gangs"]["pods_placed"]) for c in cand),
            tuple(float(r["gangs"]["pods_placed"]) for r in ref),
            "",
            (),
        ),
        Figure(
            "gangs placed whole",
            placed_c,
            placed_r,
            "≥ baseline",
            fewer,
        ),
        Figure(
            "gangs the other placed whole, not placed whole",
            missed_by_cand,
            missed_by_ref,
            "0",
            tuple(s for s, m in zip(seeds, missed_by_cand, strict=True) if m > 0),
        ),
        Figure(
            "gangs the end cut off within the other's time + slack",
            tuple(float(len(u)) for u in cut_c),
            tuple(float(len(u)) for u in cut_r),
            "",
            (),
        ),
    ]


def _number(value: float) -> str:
    if abs(value) >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.1f}"


def _spread(values: Sequence[float], *, ratio: bool = False) -> str:
    show = (lambda v: f"{v:.3f}×") if ratio else _number
    mean = statistics.fmean(values)
    return f"{show(mean)} ({show(min(values))}–{show(max(values))})"


def markdown(
    figures: Sequence[Figure],
    seeds: Sequence[int],
    *,
    candidate: str = "bigfleet",
    reference: str = "baseline",
) -> str:
    """The table: mean (min–max) of each side, every seed, the goal and where it is missed."""
    lines = [
        f"| ({len(seeds)} seeds: mean (min–max)) | {candidate} | {reference} "
        f"| per seed ({', '.join(map(str, seeds))}): {candidate}/{reference} "
        "| goal | missed at seeds |",
        "|---|---|---|---|---|---|",
    ]
    for f in figures:
        is_ratio = f.label in _RATIOS
        per_seed = ", ".join(
            f"{c:.2f}" if is_ratio else f"{_number(c)}/{_number(r)}"
            for c, r in zip(f.candidate, f.reference, strict=True)
        )
        lines.append(
            f"| {f.label} | {_spread(f.candidate, ratio=is_ratio)} "
            f"| {'1' if is_ratio else _spread(f.reference)} | {per_seed} | {f.goal or '—'} "
            f"| {', '.join(map(str, f.missed)) if f.missed else ('none' if f.goal else '—')} |"
        )
    met = [f for f in figures if f.goal]
    missed = [f for f in met if f.missed]
    lines.append("")
    lines.append(
        f"Goals met at every seed: {len(met) - len(missed)} of {len(met)}"
        + (f"; missed: {', '.join(f.label for f in missed)}." if missed else ".")
    )
    for f in figures:
        if f.label == "cost floor vs baseline":
            out_of_reach = [s for s, x in zip(seeds, f.candidate, strict=True) if x > COST_GOAL]
            if out_of_reach:
                lines.append(
                    f"The cost goal ({COST_GOAL}× the baseline) lies below the cost floor at "
                    f"seeds {', '.join(map(str, out_of_reach))}: no policy that places pods on "
                    "arrival can meet it there."
                )
    return "\n".join(lines) + "\n"


def to_json(figures: Sequence[Figure], seeds: Sequence[int]) -> str:
    """``seeds.json``: every figure's values per seed, its goal and the seeds that miss it."""
    return json.dumps(
        {
            "seeds": list(seeds),
            "figures": [
                {
                    "label": f.label,
                    "candidate": list(f.candidate),
                    "reference": list(f.reference),
                    "goal": f.goal,
                    "missed": list(f.missed),
                }
                for f in figures
            ],
        },
        indent=2,
    )
