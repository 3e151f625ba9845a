"""``combine`` adds left to right, so its result does not depend on the CPU or BLAS kernel."""

from __future__ import annotations

import numpy as np
import pytest

from shard_engine.linear import combine


def left_to_right(weights: np.ndarray, shapes: np.ndarray) -> list[float]:
    out = []
    for j in range(shapes.shape[1]):
        total = 0.0
        for k in range(shapes.shape[0]):
            term = float(weights[k]) * float(shapes[k, j])
            total = term if k == 0 else total + term
        out.append(total)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_a_vector_of_counts_is_summed_left_to_right(seed: int) -> None:
    rng = np.random.default_rng(seed)
    profiles, resources = int(rng.integers(1, 400)), int(rng.integers(1, 6))
    weights = rng.random(profiles) * rng.integers(1, 50, profiles)
    shapes = rng.random((profiles, resources)) * 1e3

    assert combine(weights, shapes).tolist() == left_to_right(weights, shapes)


@pytest.mark.parametrize("seed", range(20))
def test_each_row_of_a_matrix_is_summed_left_to_right(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows, profiles, resources = (int(rng.integers(1, n)) for n in (6, 200, 6))
    weights = rng.random((rows, profiles))
    shapes = rng.random((profiles, resources)) * 1e3

    assert combine(weights, shapes).tolist() == [
        left_to_right(weights[i], shapes) for i in range(rows)
    ]


def test_no_profiles_give_zeros_of_the_right_shape() -> None:
    shapes = np.zeros((0, 3))

    assert combine(np.zeros(0), shapes).tolist() == [0.0, 0.0, 0.0]
    assert combine(np.zeros((2, 0)), shapes).tolist() == [[0.0] * 3] * 2


def test_it_agrees_with_matrix_multiplication_up_to_rounding() -> None:
    rng = np.random.default_rng(7)
    weights, shapes = rng.random((3, 50)), rng.random((50, 4))

    np.testing.assert_allclose(combine(weights, shapes), weights @ shapes, rtol=1e-12)


def test_no_deciding_module_multiplies_matrices_through_blas() -> None:
    import ast
    from pathlib import Path

    import shard_engine

    offenders = []
    for path in sorted(Path(shard_engine.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                offenders.append(f"{path.name}:{node.lineno} @")
            if isinstance(node, ast.Attribute) and node.attr in {"dot", "matmul", "einsum"}:
                offenders.append(f"{path.name}:{node.lineno} {node.attr}")

    assert offenders == [], "use shard_engine.linear.combine (ADR 0151)"
