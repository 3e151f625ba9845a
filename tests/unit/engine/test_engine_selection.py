"""The fast covers decide exactly as the rules they implement, stated step by step."""

from __future__ import annotations

import numpy as np
from engine_fleet import machine
from hypothesis import given, settings
from hypothesis import strategies as st

from shard_engine import selection
from shard_engine.catalog import LABEL_ZONE, ProfileCatalog
from shard_engine.model import TopologySpread, WhenUnsatisfiable
from shard_engine.topology import SpreadState

ZONES = ("z0", "z1", "z2", "z3")


@st.composite
def spread_problems(draw: st.DrawFn) -> dict[str, object]:
    """A catalog of shapes in zones (some in racks), spreads over them, and a deficit."""
    catalog = ProfileCatalog()
    groups = draw(st.integers(1, 24))
    profiles = []
    for g in range(groups):
        labels = {}
        if draw(st.booleans()):
            labels["rack"] = draw(st.sampled_from(("r0", "r1", "r2")))
        record = machine(
            f"m{g}",
            zone=draw(st.sampled_from(ZONES)),
            instance_type=f"t{g}",
            cpu=draw(st.sampled_from((0.0, 2.0, 4.0, 8.0))),
            gpu=draw(st.sampled_from((0.0, 0.0, 1.0))),
            labels=labels,
        )
        profiles.append(catalog.intern(catalog.key_of(record)))
    catalog.ensure_dimensions()
    keys = draw(st.lists(st.sampled_from((LABEL_ZONE, "rack")), min_size=1, max_size=2))
    spreads = tuple(
        TopologySpread(
            key,
            draw(st.integers(1, 2)),
            draw(
                st.sampled_from(
                    (WhenUnsatisfiable.DO_NOT_SCHEDULE, WhenUnsatisfiable.SCHEDULE_ANYWAY)
                )
            ),
        )
        for key in keys
    )
    size = len(catalog)
    mask = np.array([draw(st.booleans()) or p in profiles for p in range(size)])
    present = np.array([draw(st.booleans()) for _ in range(size)])
    held = np.array([float(draw(st.integers(0, 3))) for _ in range(size)])
    dims = len(catalog.dims)
    deficit = np.array([float(draw(st.sampled_from((0.0, 1.0, 5.0, 30.0)))) for _ in range(dims)])
    return {
        "catalog": catalog,
        "spreads": spreads,
        "mask": mask,
        "present": present,
        "held": held,
        "profiles": np.array(profiles, dtype=np.int64),
        "available": np.array([draw(st.integers(0, 6)) for _ in profiles], dtype=np.int64),
        "preference": np.array(
            [float(draw(st.integers(0, 3))) for _ in profiles], dtype=np.float64
        ),
        "deficit": deficit,
        "max_steps": draw(st.integers(1, 60)),
    }


def spread_state(problem: dict[str, object]) -> SpreadState:
    return SpreadState(
        catalog=problem["catalog"],  # type: ignore[arg-type]
        spreads=problem["spreads"],  # type: ignore[arg-type]
        mask=problem["mask"],  # type: ignore[arg-type]
        present=problem["present"],  # type: ignore[arg-type]
        held=problem["held"],  # type: ignore[arg-type]
    )


@settings(max_examples=200, deadline=None)
@given(spread_problems())
def test_water_filling_by_domain_decides_as_the_machine_by_machine_rule(
    problem: dict[str, object],
) -> None:
    catalog: ProfileCatalog = problem["catalog"]  # type: ignore[assignment]
    profiles: np.ndarray = problem["profiles"]  # type: ignore[assignment]
    fast_state, reference_state = spread_state(problem), spread_state(problem)
    arguments = dict(
        deficit=problem["deficit"],
        aggregate=problem["deficit"],
        available=problem["available"],
        alloc=catalog.alloc[profiles],
        profiles=profiles,
        preference=problem["preference"],
        max_steps=problem["max_steps"],
        tolerance=1e-9,
    )

    fast = selection.cover_with_spread(spread=fast_state, **arguments)  # type: ignore[arg-type]
    reference = selection.cover_with_spread_stepwise(
        spread=reference_state,
        **arguments,  # type: ignore[arg-type]
    )

    assert fast[0] == reference[0]
    assert np.array_equal(fast[1], reference[1])
    assert fast[2] == reference[2]
    for a, b in zip(fast_state.counts, reference_state.counts, strict=True):
        assert np.array_equal(a, b)
    for a, b in zip(fast_state.eligible, reference_state.eligible, strict=True):
        assert np.array_equal(a, b)
