"""What a machine holds of a need: whole units, derived on paper."""

from __future__ import annotations

import numpy as np

from shard_engine.usable import have_rows, usable_shapes

GI = float(2**30)
# Allocatable of m6i.2xlarge, .4xlarge and .8xlarge after system reserve (cores, GiB).
SHAPES = np.array([[7.9, 28.3], [15.9, 58.4], [31.8, 118.6]])


def test_a_machine_is_worth_the_whole_pods_it_holds() -> None:
    # 4-core, 16 GiB pods: 7.9 cores hold one, 15.9 hold three, 31.8 hold seven.
    usable = usable_shapes(SHAPES, np.array([[4.0, 16.0]]))
    assert usable[0].tolist() == [[4.0, 16.0], [12.0, 48.0], [28.0, 112.0]]


def test_only_the_binding_resource_is_counted_in_whole_units() -> None:
    # 2-core, 16 GiB pods on 15.9 cores / 58.4 GiB: memory binds at three pods (48 GiB).
    # The unit is each resource's largest pod separately, so other pods may be smaller in
    # memory and use the cores three such pods leave: cores count at their allocatable.
    usable = usable_shapes(SHAPES[1:2], np.array([[2.0, 16.0]]))
    assert usable[0, 0].tolist() == [15.9, 48.0]


def test_a_mixed_need_is_not_worth_one_unit_in_every_resource() -> None:
    # Four 1-core pods and 8 GiB, the largest pod asking 1 core and 1 GiB, on 1-core,
    # 16 GiB machines: the cores bind at one unit; memory counts whole (16 GiB), so four
    # machines cover it, not the eight that 1 GiB of memory a machine would ask for.
    shapes = np.array([[1.0, 16.0]])
    unit = np.array([[1.0, 1.0]])
    usable = usable_shapes(shapes, unit)
    assert usable[0, 0].tolist() == [1.0, 16.0]
    have = have_rows(np.array([[4.0]]), usable)
    assert (have[0] >= np.array([4.0, 8.0])).all()


def test_a_need_without_a_unit_counts_allocatable() -> None:
    usable = usable_shapes(SHAPES, np.zeros((1, 2)))
    assert np.array_equal(usable[0], SHAPES)


def test_a_resource_the_unit_does_not_ask_for_counts_whole() -> None:
    usable = usable_shapes(SHAPES[2:3], np.array([[4.0, 0.0]]))
    assert usable[0, 0].tolist() == [28.0, 118.6]


def test_sixteen_machines_hold_192_cores_of_pods_not_254() -> None:
    # The tiers-small episode (issue 18): 3 × 8xlarge, 7 × 4xlarge, 6 × 2xlarge hold
    # 254.1 allocatable cores but only 3·7 + 7·3 + 6·1 = 48 pods of 4 cores (192): a need
    # of 208 cores (52 pods) is 16 cores short, not covered.
    counts = np.array([[6.0, 7.0, 3.0]])
    have = have_rows(counts, usable_shapes(SHAPES, np.array([[4.0, 16.0]])))
    assert have[0].tolist() == [192.0, 768.0]
    assert float(counts[0] @ SHAPES[:, 0]) > 208.0
