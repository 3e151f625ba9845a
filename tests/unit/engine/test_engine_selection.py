"""The fast covers decide exactly as the rules they implement, stated step by step."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from hypothesis import given, settings
from hypothesis import strategies as st

from shard_engine import selection
from shard_engine.catalog import LABEL_ZONE, ProfileCatalog
from shard_engine.model import TopologySpread, WhenUnsatisfiable
from shard_engine.topology import SpreadState
from tests.unit.engine.engine_fleet import machine
from tests.unit.engine.oracles import domain_water_fill, vectorised_cover

ZONES = ("z0", "z1", "z2", "z3")


@dataclass(frozen=True)
class SpreadProblem:
    """Shapes in zones (some in racks), spreads over them, a deficit to cover."""

    catalog: ProfileCatalog
    spreads: tuple[TopologySpread, ...]
    mask: npt.NDArray[np.bool_]
    present: npt.NDArray[np.bool_]
    held: npt.NDArray[np.float64]
    profiles: npt.NDArray[np.int64]
    available: npt.NDArray[np.int64]
    preference: npt.NDArray[np.float64]
    deficit: npt.NDArray[np.float64]
    max_steps: int

    def state(self) -> SpreadState:
        return SpreadState(
            catalog=self.catalog,
            spreads=self.spreads,
            mask=self.mask,
            present=self.present,
            held=self.held,
        )


@st.composite
def spread_problems(draw: st.DrawFn) -> SpreadProblem:
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
    when = st.sampled_from((WhenUnsatisfiable.DO_NOT_SCHEDULE, WhenUnsatisfiable.SCHEDULE_ANYWAY))
    spreads = tuple(TopologySpread(key, draw(st.integers(1, 2)), draw(when)) for key in keys)
    size = len(catalog)
    dims = len(catalog.dims)
    return SpreadProblem(
        catalog=catalog,
        spreads=spreads,
        mask=np.array([draw(st.booleans()) or p in profiles for p in range(size)]),
        present=np.array([draw(st.booleans()) for _ in range(size)]),
        held=np.array([float(draw(st.integers(0, 3))) for _ in range(size)]),
        profiles=np.array(profiles, dtype=np.int64),
        available=np.array([draw(st.integers(0, 6)) for _ in profiles], dtype=np.int64),
        preference=np.array([float(draw(st.integers(0, 3))) for _ in profiles]),
        deficit=np.array(
            [float(draw(st.sampled_from((0.0, 1.0, 5.0, 30.0)))) for _ in range(dims)]
        ),
        max_steps=draw(st.integers(1, 60)),
    )


Fill = tuple[list[selection.Pick], npt.NDArray[np.float64], bool]


def fill(problem: SpreadProblem, rule: Callable[..., Fill], state: SpreadState) -> Fill:
    """``rule`` (a water-fill with ``cover_with_spread``'s arguments) over ``problem``."""
    return rule(
        deficit=problem.deficit,
        aggregate=problem.deficit,
        available=problem.available,
        alloc=problem.catalog.alloc[problem.profiles],
        profiles=problem.profiles,
        preference=problem.preference,
        spread=state,
        max_steps=problem.max_steps,
        tolerance=1e-9,
    )


def assert_same_fill(
    got: Fill, got_state: SpreadState, want: Fill, want_state: SpreadState
) -> None:
    """Same picks in the same order, same deficit, same block, same spread state after."""
    assert got[0] == want[0]
    assert np.array_equal(got[1], want[1])
    assert got[2] == want[2]
    for a, b in zip(got_state.counts, want_state.counts, strict=True):
        assert np.array_equal(a, b)
    for e, f in zip(got_state.eligible, want_state.eligible, strict=True):
        assert np.array_equal(e, f)


@settings(max_examples=200, deadline=None)
@given(spread_problems())
def test_water_filling_by_domain_decides_as_the_machine_by_machine_rule(
    problem: SpreadProblem,
) -> None:
    fast_state, reference_state = problem.state(), problem.state()

    fast = fill(problem, selection.cover_with_spread, fast_state)
    reference = fill(problem, selection.cover_with_spread_stepwise, reference_state)

    assert_same_fill(fast, fast_state, reference, reference_state)


@settings(max_examples=300, deadline=None)
@given(spread_problems())
def test_the_compiled_water_fill_is_the_python_one(problem: SpreadProblem) -> None:
    compiled_state, python_state = problem.state(), problem.state()

    compiled = fill(problem, selection.cover_with_spread, compiled_state)
    expected = fill(problem, domain_water_fill, python_state)

    assert_same_fill(compiled, compiled_state, expected, python_state)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), groups=st.integers(1, 400), dims=st.integers(1, 3))
def test_the_compiled_cost_cover_decides_as_the_vectorised_one(
    data: st.DataObject, groups: int, dims: int
) -> None:
    """At every size: the numpy formulation ran above 96 groups until the cover was compiled."""
    values = st.sampled_from((0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 96.0))
    alloc = np.array([[data.draw(values) for _ in range(dims)] for _ in range(groups)])
    available = np.array([data.draw(st.integers(0, 5)) for _ in range(groups)], dtype=np.int64)
    cost = np.array([data.draw(st.sampled_from((0.0, 0.1, 1.0, 2.3, 6.0))) for _ in range(groups)])
    deficit = np.array(
        [data.draw(st.sampled_from((0.0, 0.3, 3.0, 17.0, 300.0))) for _ in range(dims)]
    )
    arguments = dict(
        deficit=deficit,
        aggregate=deficit,
        available=available,
        alloc=alloc,
        cost=cost,
        names=("cpu", "memory", "nvidia.com/gpu")[:dims],
        tolerance=1e-9,
    )

    compiled = selection.cover_by_cost(**arguments)  # type: ignore[arg-type]
    vectorised = vectorised_cover(**arguments)  # type: ignore[arg-type]

    assert compiled[0] == vectorised[0]
    assert np.array_equal(compiled[1], vectorised[1])
