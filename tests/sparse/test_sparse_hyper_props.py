"""Seeded property tests of the hypersparse and rank-3+ sparse kernels (AUDIT26 R3-R5), each
statement through SQL against numpy (tests/fuzz_oracle.py) on the densified inputs:

- rank-3 and rank-4 sparse tensors (COO tiles, one or several), every dtype, NaN and infinities
  among the entries, a zero extent now and then: SUM/MAX/MIN over any labels (``reduce_nd``,
  ``reduce_nd_csr`` where the plan keeps a matrix output sparse) and contractions with a finite
  dense operand (``contract_nd``);
- hypersparse matrices (far more rows than entries: COO tiles) through every kernel that takes
  a sparse matrix: SpMM/SpMV, SpGEMM, the reductions, the elementwise join, min-plus with fill
  +inf, SDDMM, the masked SpGEMM, and read back (``SELECT *``, ``con.sparse``).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import tensordb
from tests import fuzz_oracle as fo

DTYPES = ["bool", "int32", "int64", "float32", "float64"]


def _kernels(con, sql):
    plan = json.loads(con.explain(sql, format="json"))
    return [n["kernel"]["method"] if isinstance(n.get("kernel"), dict) else n.get("kernel")
            for n in plan["nodes"]]


def _sparse_array(rng, shape, nse, dtype, special):
    """A dense array of ``shape`` with about ``nse`` entries (small integers, a NaN, +inf or
    -inf among them where ``special`` and floating)."""
    dtype = np.dtype(dtype)
    a = np.zeros(shape, dtype)
    size = int(np.prod(shape))
    if not size:
        return a
    lin = rng.choice(size, min(nse, size), replace=False)
    if dtype.kind == "b":
        a.reshape(-1)[lin] = True
        return a
    a.reshape(-1)[lin] = (rng.integers(1, 9, lin.size) * rng.choice([-1, 1], lin.size)).astype(dtype)
    if special and dtype.kind == "f" and lin.size >= 2:
        a.reshape(-1)[lin[:2]] = rng.choice([np.nan, np.inf, -np.inf], 2)
    return a


def _check(con, sql, case, expect=None):
    oracle = fo.answer(case)
    if expect is not None:
        assert _kernels(con, sql) == [expect], (sql, _kernels(con, sql))
    if oracle.error is not None:
        with pytest.raises(tensordb.Error):
            con.execute(sql)
        return
    con.execute(sql)
    got = con.tensor(case_out_name(sql))
    problem = fo.compare(got, oracle)
    assert problem is None, f"{sql}: {problem}"


def case_out_name(sql):
    return sql.split("=")[0].split("[")[0].strip()


@pytest.mark.parametrize("seed", range(3))
def test_rank_3_and_4_reductions_and_contractions_against_numpy(seed, tmp_path):
    rng = np.random.default_rng(4000 + seed)
    with tensordb.connect(tmp_path / "db", workers=int(rng.integers(1, 3))) as con:
        for case in range(10):
            dtype = DTYPES[(case + seed) % len(DTYPES)]
            rank = 3 + case % 2
            labels = "abcd"[:rank]
            shape = [int(rng.integers(2, 9)) for _ in range(rank)]
            if case % 5 == 4:
                shape[int(rng.integers(rank))] = 0  # an empty tensor
            nse = max(1, int(np.prod(shape)) // int(rng.integers(8, 30)))
            a = _sparse_array(rng, tuple(shape), nse, dtype, special=rng.random() < 0.6)
            tile = tuple(int(rng.integers(1, max(s, 1) + 1)) for s in shape) \
                if rng.random() < 0.5 else None
            name = f"T{case}"
            con.load(name, a, tile=tile) if tile else con.load(name, a)
            ref = f"{name}[{','.join(labels)}]"
            # reductions: each aggregate over a random subset of the labels, a random order
            for agg in ("SUM", "MAX", "MIN"):
                k = int(rng.integers(0, rank))
                out = "".join(rng.permutation(list(labels))[:k])
                sql = f"R{case}{'[' + ','.join(out) + ']' if out else ''} = {agg}({ref})"
                fc = fo.Case(tuple(out), [fo.Operand(name, tuple(labels), a)], ("in", 0),
                             agg.lower())
                sparse_stored = con.store.open(name).has_sparse
                _check(con, sql, fc, "spreduce" if sparse_stored else None)
            # a contraction with a finite dense operand: some of T's labels shared (contracted),
            # the rest kept, the dense operand's own label kept
            if np.dtype(dtype).kind == "b":
                continue
            shared = list(rng.permutation(list(labels))[:int(rng.integers(1, rank))])
            d_labels = shared + ["k"]
            rng.shuffle(d_labels)
            kept = [l for l in labels if l not in shared]
            out = [l for l in kept if rng.random() < 0.7] + ["k"]
            rng.shuffle(out)
            sizes = dict(zip(labels, shape), k=int(rng.integers(1, 4)))
            d = rng.integers(-4, 5, tuple(sizes[l] for l in d_labels)).astype(dtype)
            con.load(f"D{case}", d)
            sql = f"C{case}[{','.join(out)}] = SUM({ref} * D{case}[{','.join(d_labels)}])"
            fc = fo.Case(tuple(out), [fo.Operand(name, tuple(labels), a),
                                      fo.Operand(f"D{case}", tuple(d_labels), d)],
                         ("*", ("in", 0), ("in", 1)), "sum")
            _check(con, sql, fc, "spmm" if con.store.open(name).has_sparse else None)
        assert con.check()[-1]["problem"] == "ok"
