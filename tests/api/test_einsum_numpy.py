"""con.einsum from a numpy user's side: arrays as operands, numpy's optimize= values, size-1
dimensions broadcast; numpy.einsum is the oracle."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

import tensordb

SPECS = ["ij,ij->ij", "ij,ij->j", "ij,ij", "ij,jk->ik", "ij,jk", "ijk,ik->ij", "ij,j->i",
         "bij,bjk->bik", "ij,kj->ik", "i,i->i", "ijk,jk->ki", "ij,jk,kl->il"]


def _random_case(rng, spec):
    """Operand shapes for ``spec`` with some dimensions of a label set to 1 (numpy broadcasts
    them against the label's size in the other operands)."""
    terms = spec.split("->")[0].split(",")
    sizes = {c: int(rng.integers(2, 5)) for c in set("".join(terms))}
    shapes = []
    for term in terms:
        shapes.append(tuple(1 if len(terms) > 1 and rng.random() < 0.3 else sizes[c]
                            for c in term))
    return [rng.standard_normal(s) for s in shapes]


@pytest.mark.parametrize("spec", SPECS)
def test_arrays_with_size_one_dimensions_as_numpy(con, spec):
    rng = np.random.default_rng(zlib.crc32(spec.encode()))
    for _ in range(4):
        arrays = _random_case(rng, spec)
        try:
            want = np.einsum(spec, *arrays)
        except ValueError:  # a label of size 1 everywhere but two different sizes elsewhere
            continue
        got = con.einsum(spec, *arrays)
        assert np.shape(got) == np.shape(want), (spec, [a.shape for a in arrays])
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    assert con.tensors() == []  # the temporaries are gone


def test_the_issue_example(con):
    x45, y15 = np.arange(20.0).reshape(4, 5), np.arange(5.0).reshape(1, 5)
    con.load("X45", x45)
    con.load("Y15", y15)
    np.testing.assert_array_equal(con.einsum("ij,ij->ij", "X45", "Y15"),
                                  np.einsum("ij,ij->ij", x45, y15))
    np.testing.assert_array_equal(con.einsum("ij,ij->ij", "X45", y15),  # a name and an array
                                  np.einsum("ij,ij->ij", x45, y15))
    con.einsum("ij,ij->ij", x45, "Y15", into="P")
    np.testing.assert_array_equal(con.tensor("P"), x45 * y15)
    assert sorted(t["name"] for t in con.tensors()) == ["P", "X45", "Y15"]


@pytest.mark.parametrize("optimize", [False, True, "greedy", "optimal",
                                      ["einsum_path", (0, 1), (0, 1)]])
def test_optimize_takes_numpys_values(con, optimize):
    rng = np.random.default_rng(3)
    a, b, c = rng.random((3, 4)), rng.random((4, 5)), rng.random((5, 2))
    want = np.einsum("ij,jk,kl->il", a, b, c, optimize=optimize)
    np.testing.assert_allclose(con.einsum("ij,jk,kl->il", a, b, c, optimize=optimize), want)


def test_lists_and_scalars_as_numpy_takes_them(con):
    assert con.einsum("i,i", [1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) == np.einsum("i,i", [1.0, 2.0, 3.0],
                                                                           [4.0, 5.0, 6.0])
    np.testing.assert_array_equal(con.einsum("ij->ji", [[1, 2], [3, 4]]),
                                  np.einsum("ij->ji", [[1, 2], [3, 4]]))


def test_sizes_numpy_refuses_are_refused_and_leave_nothing(con):
    a, b = np.ones((3, 4)), np.ones((5, 2))
    with pytest.raises(ValueError):
        np.einsum("ij,jk->ik", a, b)
    with pytest.raises(tensordb.BinderError, match="label 'j' has size 4"):
        con.einsum("ij,jk->ik", a, b)
    z = np.ones((1, 3))
    with pytest.raises(ValueError):
        np.einsum("ii->i", z)  # a diagonal does not broadcast
    with pytest.raises(tensordb.BinderError, match="label 'i'"):
        con.einsum("ii->i", z)
    with pytest.raises(tensordb.Error):
        con.einsum("ij,jk->ik", np.ones((2, 2)), np.array([["a", "b"], ["c", "d"]]))
    assert con.tensors() == []


def test_a_temporary_does_not_take_a_users_name(con):
    con.load("_einsum_operand0", np.full((2, 2), 7.0))
    a = np.eye(2)
    np.testing.assert_array_equal(con.einsum("ij,jk->ik", a, "_einsum_operand0"),
                                  np.full((2, 2), 7.0))
    np.testing.assert_array_equal(con.tensor("_einsum_operand0"), np.full((2, 2), 7.0))
    assert [t["name"] for t in con.tensors()] == ["_einsum_operand0"]
