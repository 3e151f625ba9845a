"""Issue 18's hand-made traces replay to the answers worked out on paper beside them.

Each trace in ``simulator/traces`` named here has a ``.md`` file beside it
with the derivation. One shard unless the case is about shards, the
shipped catalogs (``quota_scale`` 1: GPU racks of 4 servers), seed 7, the
real engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest

from shard_engine.engine import EngineConfig
from shard_engine.model import Action, AssignIdle, Provision
from simulator.driver import RunOptions, run_policy
from simulator.golden import TRACES
from simulator.trace import load_trace


class Provisions:
    """Records every Provision the shard's core is given, with its virtual time."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, tuple[str, ...]]] = []
        # (shard, cluster, machine) of every machine created or handed an idle one
        self.created: list[tuple[str, str, str]] = []
        self.reused: list[tuple[str, str, str]] = []
        self.reused_at: list[float] = []  # when each of ``reused`` was planned

    def plan(self, shard_id: str, now: float, actions: Sequence[Action]) -> None:
        self.seen += [(now, a.machine_ids) for a in actions if isinstance(a, Provision)]
        for a in actions:
            if isinstance(a, Provision):
                self.created += [(shard_id, a.cluster_id, m) for m in a.machine_ids]
            elif isinstance(a, AssignIdle):
                self.reused.append((shard_id, a.cluster_id, a.machine_id))
                self.reused_at.append(now)

    def operation(self, shard_id: str, op: object) -> None:
        return None


def replay(
    name: str,
    tap: Provisions | None = None,
    *,
    shards: int = 1,
    engine: EngineConfig | None = None,
    later: Mapping[str, float] | None = None,
    early_report_gap_s: float | None = None,
) -> dict[str, Any]:
    """The trace under BigFleet; ``later`` shifts each named cluster's events by seconds."""
    trace = load_trace(TRACES / f"{name}.jsonl")
    if later:
        events = (replace(e, t=e.t + later.get(e.cluster, 0.0)) for e in trace.events)
        trace = replace(trace, events=tuple(sorted(events, key=lambda e: e.t)))
    options = RunOptions(
        quota_scale=1.0, seed=7, shards=shards, workers=1, engine=engine or EngineConfig()
    )
    if early_report_gap_s is not None:
        options = replace(options, early_report_gap_s=early_report_gap_s)
    return run_policy(trace, "bigfleet", options, tap=tap).summary


def test_two_gangs_of_four_run_in_two_racks_of_four() -> None:
    summary = replay("gangs-two-racks")

    tier = summary["time_to_capacity"]["p900000"]
    assert (tier["placed"], tier["never_placed"]) == (8, 0)
    assert summary["nodes_joined"] == 8
    gangs = summary["gangs"]
    assert (gangs["total"], gangs["pods"], gangs["pods_placed"], gangs["placed_whole"]) == (
        2,
        8,
        8,
        2,
    )


def test_nine_pods_of_four_cores_get_three_m6i_4xlarge_in_one_round() -> None:
    tap = Provisions()
    summary = replay("shapes-nine-pods", tap)

    first_time, first = tap.seen[0]
    assert first_time < 30.0  # the first cycles after the pods arrive
    assert len(first) == 3
    assert all("m6i-4xlarge" in machine for machine in first)
    tier = summary["time_to_capacity"]["p100000"]
    assert (tier["placed"], tier["never_placed"]) == (9, 0)
    assert tier["p99_s"] <= 120.0  # one launch round (boot ~60-80 s) plus a roll-up and a cycle


def test_the_anti_correlated_burst_runs_on_the_six_nodes_that_hold_it() -> None:
    summary = replay("burst-anticorrelated")

    tier = summary["time_to_capacity"]["p100000"]
    assert (tier["placed"], tier["never_placed"]) == (24, 0)
    assert summary["nodes_joined"] == 6
    assert summary["fragmentation_pod_minutes"] == 0.0


# idle-two-shards: 4 servers of gp-2x9354-768g ($1.20/h amortised), billed from the
# claim at t = 10 s to the end of the run (10,800 s) however they are used after.
ONE_SET = 4 * 1.20 * (10_800 - 10) / 3600  # $14.39
SECOND_SET = 4 * 1.20 * (10_800 - 5_400) / 3600  # $7.20, claimed when svc-b arrives


def test_the_second_cluster_reuses_the_first_clusters_idle_servers_on_one_shard() -> None:
    tap = Provisions()
    summary = replay("idle-two-shards", tap)

    assert summary["cost_usd"] == pytest.approx(ONE_SET, abs=0.01)
    assert {c for _s, c, _m in tap.created} == {"svc-a"}
    assert sorted(m for _s, c, m in tap.reused if c == "svc-b") == sorted(
        m for _s, _c, m in tap.created
    )


def test_on_two_shards_the_second_cluster_takes_the_other_shards_idle_servers() -> None:
    tap = Provisions()
    summary = replay("idle-two-shards", tap, shards=2)

    assert summary["cost_usd"] == pytest.approx(ONE_SET, abs=0.01)
    assert summary["cost_usd"] == replay("idle-two-shards")["cost_usd"]
    created = {(s, c) for s, c, _m in tap.created}
    assert created == {("shard-00", "svc-a")}, "no new server for svc-b"
    reused = sorted(m for s, c, m in tap.reused if (s, c) == ("shard-01", "svc-b"))
    assert reused == sorted(m for _s, _c, m in tap.created)
    tier = summary["time_to_capacity"]["p100000"]
    assert (tier["placed"], tier["never_placed"]) == (8, 0)


@pytest.mark.parametrize(("gap", "assigned_at"), [(10.0, 5_420.0), (30.0, 5_440.0)])
def test_a_shard_reports_its_new_shortfall_after_the_cycle_that_found_it(
    gap: float, assigned_at: float
) -> None:
    # ADR 0184, on paper (idle-two-shards.md with svc-b one second later): svc-b's pods
    # arrive at 5,401 s and reach shard-01 in the roll-up of 5,410 s; that cycle's need
    # waits for shard-00's idle servers and is a shortfall shard-01 has not reported.
    # Reporting it at once, the coordinator's round of 5,410 s moves the servers and the
    # 5,420 s cycle assigns them; at the 30 s interval the round is at 5,430 s (after that
    # tick's cycle) and the assignment at 5,440 s. Either way nothing is claimed for svc-b.
    tap = Provisions()
    summary = replay("idle-two-shards", tap, shards=2, later={"svc-b": 1.0}, early_report_gap_s=gap)

    assert {(s, c) for s, c, _m in tap.created} == {("shard-00", "svc-a")}
    reused = [
        (at, m)
        for at, (s, c, m) in zip(tap.reused_at, tap.reused, strict=True)
        if (s, c) == ("shard-01", "svc-b")
    ]
    assert sorted(m for _at, m in reused) == sorted(m for _s, _c, m in tap.created)
    assert {at for at, _m in reused} == {assigned_at}
    assert summary["cost_usd"] == pytest.approx(ONE_SET, abs=0.01)


def test_without_the_fleet_idle_wait_the_second_shard_claims_four_more_servers() -> None:
    tap = Provisions()
    summary = replay(
        "idle-two-shards", tap, shards=2, engine=EngineConfig(fleet_idle_wait_seconds=0)
    )

    assert summary["cost_usd"] == pytest.approx(ONE_SET + SECOND_SET, abs=0.01)  # $21.59
    assert sorted({(s, c) for s, c, _m in tap.created}) == [
        ("shard-00", "svc-a"),
        ("shard-01", "svc-b"),
    ]
    assert len(tap.created) == 8


# gang-idle-two-shards: 4 H100 servers ($28/h amortised) claimed at t = 10 s for train-a's
# gang; a second set claimed at 5,400 s if train-b's gang does not take them. Billed to the
# end of the run's last one-second tick, 10,801 s (at $1.20/h above, the second is invisible).
GANG_SET = 4 * 28.0 * (10_801 - 10) / 3600  # $335.72
GANG_SECOND_SET = 4 * 28.0 * (10_801 - 5_400) / 3600  # $168.03


def test_on_two_shards_a_gang_takes_the_rack_the_other_shard_holds_idle() -> None:
    tap = Provisions()
    summary = replay("gang-idle-two-shards", tap, shards=2)

    assert summary["cost_usd"] == pytest.approx(GANG_SET, abs=0.01)
    assert summary["cost_usd"] == replay("gang-idle-two-shards")["cost_usd"]
    assert summary["actions"]["transfer:idle"] == 1
    assert {(s, c) for s, c, _m in tap.created} == {("shard-00", "train-a")}
    reused = sorted(m for s, c, m in tap.reused if (s, c) == ("shard-01", "train-b"))
    assert reused == sorted(m for _s, _c, m in tap.created)
    assert summary["gangs"]["whole"] == ["train-a/ga", "train-b/gb"]


def test_a_gang_that_does_not_wait_claims_a_second_rack() -> None:
    tap = Provisions()
    summary = replay(
        "gang-idle-two-shards", tap, shards=2, engine=EngineConfig(fleet_idle_wait_seconds=0)
    )

    assert summary["cost_usd"] == pytest.approx(GANG_SET + GANG_SECOND_SET, abs=0.01)
    assert sorted({(s, c) for s, c, _m in tap.created}) == [
        ("shard-00", "train-a"),
        ("shard-01", "train-b"),
    ]
    assert len(tap.created) == 8


# gang-idle-and-slot-two-shards: 2 servers claimed at t = 10 s for train-a's gang; train-b's
# gang of 3 takes them idle and claims one slot of their rack (one shard: at 5,400 s; two
# shards: a cycle later, after the coordinator's transfers), or claims 3 of its own rack.
PAIR = 2 * 28.0 * (10_801 - 10) / 3600  # $167.86


def test_a_gang_takes_another_shards_idle_servers_and_a_slot_of_their_rack() -> None:
    one = replay("gang-idle-and-slot-two-shards")
    tap = Provisions()
    two = replay("gang-idle-and-slot-two-shards", tap, shards=2)

    assert one["cost_usd"] == pytest.approx(PAIR + 28.0 * (10_801 - 5_400) / 3600, abs=0.01)
    assert two["cost_usd"] == pytest.approx(PAIR + 28.0 * (10_801 - 5_410) / 3600, abs=0.01)
    assert (two["actions"]["transfer:idle"], two["actions"]["transfer:speculative"]) == (1, 1)
    first = {m for s, c, m in tap.created if (s, c) == ("shard-00", "train-a")}
    reused = {m for s, c, m in tap.reused if (s, c) == ("shard-01", "train-b")}
    (claimed,) = [m for s, c, m in tap.created if (s, c) == ("shard-01", "train-b")]
    assert reused == first
    assert claimed.rsplit("-", 1)[0] == next(iter(first)).rsplit("-", 1)[0], "the same rack"
    assert two["gangs"]["whole"] == ["train-a/ga", "train-b/gb"]


def test_a_gang_that_does_not_wait_claims_three_servers_of_its_own_rack() -> None:
    summary = replay(
        "gang-idle-and-slot-two-shards", shards=2, engine=EngineConfig(fleet_idle_wait_seconds=0)
    )
    assert summary["cost_usd"] == pytest.approx(PAIR + 3 * 28.0 * (10_801 - 5_400) / 3600, abs=0.01)


def test_a_higher_priority_preempts_across_shards_exactly_what_it_lacks() -> None:
    tap = Provisions()
    summary = replay("preempt-two-shards", tap, shards=2)

    actions = summary["actions"]
    assert (actions["transfer:preempt"], actions["preemptions_cross_shard"]) == (1, 2)
    assert summary["preempted_pods"] == 2
    assert {c for _s, c, _m in tap.created} == {"train-low"}, "nothing bought for serve-high"
    taken = [m for s, c, m in tap.reused if (s, c) == ("shard-00", "serve-high")]
    assert len(taken) == 2
    assert set(taken) <= {m for _s, _c, m in tap.created}
    high, low = summary["time_to_capacity"]["p100000"], summary["time_to_capacity"]["p1000"]
    assert (high["placed"], high["never_placed"]) == (2, 0)
    assert (low["placed"], low["never_placed"]) == (8, 0)
    # Idle only from the end of the drains to the assignment: well under a minute each.
    assert summary["cost_by_category_usd"].get("bare-metal-gpu/idle", 0.0) < 2 * 28.0 / 60


# oldest-first-two-shards: two racks of 4 H100 servers, claimed at t = 10 s and 20 s and
# billed to the end of the run's last tick, 10,801 s; no other GPU server exists.
BOTH_RACKS = 4 * 28.0 * (10_801 - 10) / 3600 + 4 * 28.0 * (10_801 - 20) / 3600  # $671.13


class Assignments(Provisions):
    """Provisions, and when each cluster was handed idle machines."""

    def __init__(self) -> None:
        super().__init__()
        self.assigned: list[tuple[float, str, str, str]] = []

    def plan(self, shard_id: str, now: float, actions: Sequence[Action]) -> None:
        super().plan(shard_id, now, actions)
        self.assigned += [
            (now, shard_id, a.cluster_id, a.machine_id)
            for a in actions
            if isinstance(a, AssignIdle)
        ]


def test_a_rack_its_cluster_no_longer_needs_goes_to_the_gang_waiting_longest() -> None:
    tap = Assignments()
    summary = replay("oldest-first-two-shards", tap, shards=2)
    _gb2_first_then_gc1(summary, tap)


def test_a_gang_of_the_racks_own_shard_leaves_it_to_the_gang_waiting_longer() -> None:
    # The same, with gc1 arriving at 3,000 s: it already waits on shard-00 when ga1's rack
    # turns excess there, and shard-00's Phase 2 would take the rack for it within a
    # cycle. gb2 on shard-01 has waited since 1,000 s: gc1 leaves the rack to it (ADR 0177).
    trace = load_trace(TRACES / "oldest-first-two-shards.jsonl")
    earlier = tuple(
        sorted(
            (replace(e, t=3_000.0) if e.cluster == "train-c" else e for e in trace.events),
            key=lambda e: e.t,
        )
    )
    tap = Assignments()
    options = RunOptions(quota_scale=1.0, seed=7, shards=2, workers=1)
    summary = run_policy(replace(trace, events=earlier), "bigfleet", options, tap=tap).summary
    _gb2_first_then_gc1(summary, tap)


def _gb2_first_then_gc1(summary: dict[str, Any], tap: Assignments) -> None:
    assert summary["cost_usd"] == pytest.approx(BOTH_RACKS, abs=0.01)
    assert summary["actions"]["transfer:preempt"] == 2
    assert summary["actions"]["preemptions_cross_shard"] == 8
    b_r03 = [(t, s, c) for t, s, c, m in tap.assigned if "b-r03" in m]
    a_r04 = [(t, s, c) for t, s, c, m in tap.assigned if "a-r04" in m]
    # ga1's rack, excess from 3,610 s, goes to train-b's gb2 (waiting since 1,000 s) on the
    # other shard before gc1 (its own shard's) has even arrived at 4,000 s ...
    assert {(s, c) for _t, s, c in b_r03} == {("shard-01", "train-b")} and len(b_r03) == 4
    assert max(t for t, _s, _c in b_r03) < 4_000
    # ... and gb1's rack, excess from 6,000 s, to train-c's gc1 across the border in turn.
    assert {(s, c) for _t, s, c in a_r04} == {("shard-00", "train-c")} and len(a_r04) == 4
    assert min(t for t, _s, _c in a_r04) > 6_000
    assert summary["gangs"]["whole"] == [
        "train-a/ga1",
        "train-b/gb1",
        "train-b/gb2",
        "train-c/gc1",
    ]


def test_a_gang_beside_servers_in_two_racks_completes_the_rack_holding_most_of_it() -> None:
    # gang-two-racks-held (ADR 0180): a gang of 4 arrives while its cluster holds 3 empty
    # servers in each of two racks; it is short (no rack holds 4 of them) and the shard
    # claims the one free server of the first rack at once.
    tap = Provisions()
    summary = replay("gang-two-racks-held", tap)

    end = 5_401  # the end of the run's last one-second tick: claimed servers bill until then
    server_seconds = 3 * (end - 10) + 3 * (end - 20) + (end - 1_900)
    assert summary["cost_usd"] == pytest.approx(28.0 * server_seconds / 3600, abs=0.01)
    assert summary["gangs"]["whole"] == ["train-0000/ga", "train-0000/gb", "train-0000/gc"]
    assert summary["time_to_capacity"]["p900000"]["never_placed"] == 0
    first, second, third = tap.seen
    assert third == (1_900.0, ("bm-ams1-a-r04-u01",))
    assert {m.rsplit("-", 1)[0] for m in first[1]} == {"bm-ams1-a-r04"}
    assert {m.rsplit("-", 1)[0] for m in second[1]} == {"bm-ams1-b-r03"}
