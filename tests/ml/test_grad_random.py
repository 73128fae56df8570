"""GRAD on random graphs of extended einsums (Graph.op: any labels, joins and aggregates),
against autograd on an oracle that evaluates each operation by broadcasting over its whole join
space with autograd.numpy, independent of tensordb."""
from __future__ import annotations

import numpy as np
import pytest

import tensordb
from tensordb.plan.builder import Graph

autograd = pytest.importorskip("autograd")
anp = pytest.importorskip("autograd.numpy")

SIZES = {"i": 3, "j": 4, "k": 2, "m": 3}
# joins over x0, x1 (inputs are positive, away from 0, so that LOG, SQRT, POW and / are smooth)
JOINS2 = ["x0 * x1", "x0 + x1", "exp(x0) * x1", "tanh(x0 - x1)", "x0 / x1", "sigmoid(x0) * x1",
          "pow(x0, x1)", "max(x0, x1 * 1.1)", "min(x0, x1) * x0", "log(x0) * x1",
          "sqrt(x0 * x1)", "-x0 * relu(x1 - 1)", "abs(x0 - x1) + square(x1)", "sin(x0) * cos(x1)",
          "where(x0 > x1, x0 * x1, exp(x1))", "(x0 >= 1) * x1 + x0 * (x1 < 1.2)"]
JOINS1 = ["x0", "exp(x0)", "log(x0)", "tanh(x0)", "x0 * x0", "sqrt(x0)"]
AGGS = ["sum", "sum", "max", "min", "prod"]

def _where(c, a, b):
    """numpy.where, its operands broadcast first (autograd's where does not unbroadcast)."""
    shape = np.broadcast_shapes(anp.shape(c), anp.shape(a), anp.shape(b))
    zeros = anp.zeros(shape)
    return anp.where(np.broadcast_to(c, shape), a + zeros, b + zeros)


NP = {"exp": anp.exp, "log": anp.log, "tanh": anp.tanh, "sqrt": anp.sqrt, "abs": anp.abs,
      "sin": anp.sin, "cos": anp.cos, "sigmoid": lambda x: 1 / (1 + anp.exp(-x)),
      "relu": lambda x: anp.maximum(x, 0), "square": lambda x: x * x,
      "max": anp.maximum, "min": anp.minimum, "pow": lambda a, b: a ** b, "where": _where}


def oracle_op(arrays, out, inputs, join, agg):
    """out[o] = agg over the other labels of join(inputs), by broadcasting (autograd.numpy)."""
    labels = list(out) + sorted({l for _, ls in inputs for l in ls} - set(out))
    values = []
    for a, ls in inputs:
        a, ls = _diagonals(a, ls)
        order = sorted(range(len(ls)), key=lambda d: labels.index(ls[d]))
        x = anp.transpose(a, order) if len(ls) > 1 else a
        shape = [SIZES[l] if l in ls else 1 for l in labels]
        values.append(anp.reshape(x, shape))
    names = {f"x{n}": v for n, v in enumerate(values)}
    space = eval(join, {"__builtins__": {}}, {**NP, **names})  # noqa: S307 - our own strings
    space = space + anp.zeros([SIZES[l] for l in labels])  # every label, even one unused
    axes = tuple(range(len(out), len(labels)))
    if not axes:
        return space
    return {"sum": anp.sum, "max": anp.max, "min": anp.min, "prod": anp.prod}[agg](space,
                                                                                    axis=axes)


def _diagonals(a, ls):
    """A read with a repeated label (``x[i,i]``) takes the diagonal first: by a mask, which
    autograd differentiates; the diagonal's axis goes last."""
    ls = list(ls)
    while len(set(ls)) < len(ls):
        q = next(d for d in range(len(ls)) if ls[d] in ls[:d])
        p = ls.index(ls[q])
        rest = [d for d in range(len(ls)) if d not in (p, q)]
        a = anp.sum(anp.transpose(a, rest + [p, q]) * np.eye(a.shape[p]), axis=-1)
        ls = [ls[d] for d in rest] + [ls[p]]
    return a, "".join(ls)


def random_case(seed):
    rng = np.random.default_rng(seed)
    letters = list(SIZES)

    def labels(n):
        return "".join(rng.choice(letters, size=n, replace=False))
    stored = {f"T{n}": labels(int(rng.integers(1, 3))) for n in range(3)}
    steps = []  # (into, out, [(name, labels)], join, agg)
    avail = dict(stored)
    for s in range(int(rng.integers(1, 3))):
        names = list(avail)
        a = names[-1] if s else str(rng.choice(names))
        b = str(rng.choice([n for n in names if n != a]))
        two = rng.random() < 0.8
        ins = [(a, avail[a])] + ([(b, avail[b])] if two else [])
        used = sorted({l for _, ls in ins for l in ls})
        out = "".join(l for l in used if rng.random() < 0.5)
        agg = str(rng.choice(AGGS)) if len(out) < len(used) else "sum"
        # a PROD over zeros has no gradient in autograd (NaN): test_grad.py checks that case
        joins = [j for j in (JOINS2 if two else JOINS1) if agg != "prod" or "relu" not in j]
        join = str(rng.choice(joins))
        into = f"O{s}"
        steps.append((into, out, ins, join, agg))
        avail[into] = out
    last = steps[-1][0]
    stored["W"] = avail[last]
    arrays = {n: rng.uniform(0.5, 1.5, size=[SIZES[l] for l in ls]) for n, ls in stored.items()}
    return arrays, stored, steps, last


@pytest.mark.filterwarnings("ignore::UserWarning")  # autograd: a loss that ignores a tensor
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the oracle's POW of a negative base
@pytest.mark.parametrize("seed", range(40))
def test_random_graph_gradients(tmp_path, seed):
    arrays, stored, steps, last = random_case(seed)
    con = tensordb.connect(tmp_path / "db")
    for n, a in arrays.items():
        con.load(n, a)
    g = Graph()
    for into, out, ins, join, agg in steps:
        g.op(into, out, ins, join=join, agg=agg, store=False)
    g.op("L", "", [(last, stored["W"]), ("W", stored["W"])], join="x0 * x1")
    wrt = [n for n in arrays]
    g.grad("L", wrt, into=[f"g{n}" for n in wrt])
    con.run(g)

    def loss(**xs):
        env = dict(xs)
        labels = dict(stored)
        for into, out, ins, join, agg in steps:
            env[into] = oracle_op(env, out, [(env[n], ls) for n, ls in ins], join, agg)
            labels[into] = out
        return oracle_op(env, "", [(env[last], labels[last]), (env["W"], stored["W"])],
                         "x0 * x1", "sum")

    text = "; ".join(f"{i}[{o}] = {a}({j} over {ins})" for i, o, ins, j, a in steps)
    _check_against_autograd(con, loss, arrays, wrt, text)


def diagonal_case(seed):
    """One operation reading a stored tensor with a repeated label (i and m have one size),
    then the loss: SUM of its result times a stored W."""
    rng = np.random.default_rng(1000 + seed)
    read = str(rng.choice(["iij", "mmj", "iji", "mjm", "iii"]))
    shape = {"iij": (3, 3, 4), "mmj": (3, 3, 4), "iji": (3, 4, 3), "mjm": (3, 4, 3),
             "iii": (3, 3, 3)}[read]
    other = "".join(rng.choice(list(SIZES), size=int(rng.integers(1, 3)), replace=False))
    ins = [("Dg", read), ("T", other)]
    if rng.random() < 0.5:
        ins.reverse()
    used = sorted({l for _, ls in ins for l in ls})
    out = "".join(l for l in used if rng.random() < 0.5)
    agg = str(rng.choice(AGGS)) if len(out) < len(used) else "sum"
    joins = [j for j in JOINS2 if agg != "prod" or "relu" not in j]
    join = str(rng.choice(joins))
    arrays = {"Dg": rng.uniform(0.5, 1.5, size=shape),
              "T": rng.uniform(0.5, 1.5, size=[SIZES[l] for l in other]),
              "W": rng.uniform(0.5, 1.5, size=[SIZES[l] for l in out])}
    return arrays, ins, out, join, agg


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("seed", range(20))
def test_random_diagonal_gradients(tmp_path, seed):
    """Gradients through diagonal reads (one label repeated in an operand) of random extended
    einsums: written on the diagonal, 0 elsewhere, against autograd."""
    arrays, ins, out, join, agg = diagonal_case(seed)
    con = tensordb.connect(tmp_path / "db")
    for n, a in arrays.items():
        con.load(n, a)
    g = Graph().op("O", out, ins, join=join, agg=agg, store=False)
    g.op("L", "", [("O", out), ("W", out)], join="x0 * x1")
    g.grad("L", list(arrays), into=[f"g{n}" for n in arrays])
    con.run(g)

    def loss(**xs):
        o = oracle_op(xs, out, [(xs[n], ls) for n, ls in ins], join, agg)
        return oracle_op(xs, "", [(o, out), (xs["W"], out)], "x0 * x1", "sum")

    _check_against_autograd(con, loss, arrays, list(arrays), f"O[{out}] = {agg}({join} over {ins})")


def _check_against_autograd(con, loss, arrays, wrt, text):
    """The stored loss L against ``loss(**arrays)``, and each stored gradient g<n> (n in ``wrt``)
    against autograd's of ``loss``; ``text`` names the case in a failure. Closes ``con``."""
    np.testing.assert_allclose(con.tensor("L"), loss(**arrays), rtol=1e-11, err_msg=text)
    for n in wrt:
        expected = autograd.grad(lambda x, n=n: loss(**{**arrays, n: x}))(arrays[n])
        np.testing.assert_allclose(con.tensor(f"g{n}"), expected, rtol=1e-9, atol=1e-12,
                                   err_msg=f"d L / d {n}: {text}")
    con.close()


# -- slices, gathers, MEAN and LOGSUMEXP: gradients scattered back (plan/select.py) ----------

ML_AGGS = ["sum", "mean", "logsumexp", "max"]


def _oracle_agg(space, agg, axes):
    if agg == "mean":
        return anp.mean(space, axis=axes)
    if agg == "logsumexp":
        return anp.log(anp.sum(anp.exp(space), axis=axes))
    return {"sum": anp.sum, "max": anp.max}[agg](space, axis=axes)


def ml_case(seed):
    """Stored tensors read whole, through a slice of their first axis ('T0[1:4]') or a gather
    of their rows ('T0[I0]'), in a random chain of operations with ML aggregates."""
    rng = np.random.default_rng(1000 + seed)
    letters = list(SIZES)
    stored, reads, index = {}, {}, {}
    for n in range(3):
        ls = "".join(rng.choice(letters, size=int(rng.integers(1, 3)), replace=False))
        name, first = f"T{n}", SIZES[ls[0]]
        how = rng.choice(["whole", "slice", "gather"], p=[0.3, 0.35, 0.35])
        if how == "slice":
            lo = int(rng.integers(0, 3))
            stored[name] = (first + lo + int(rng.integers(0, 3)),) + tuple(SIZES[l] for l in ls[1:])
            reads[name] = (f"{name}[{lo}:{lo + first}]", ls, (lo, lo + first))
        elif how == "gather":
            rows = int(rng.integers(2, 6))
            stored[name] = (rows,) + tuple(SIZES[l] for l in ls[1:])
            index[f"I{n}"] = rng.integers(-rows, rows, size=first)
            reads[name] = (f"{name}[I{n}]", ls, f"I{n}")
        else:
            stored[name] = tuple(SIZES[l] for l in ls)
            reads[name] = (name, ls, None)
    steps, avail = [], {reads[t][0]: reads[t][1] for t in stored}
    for s in range(int(rng.integers(1, 3))):
        names = list(avail)
        a = names[-1] if s else str(rng.choice(names))
        b = str(rng.choice([n for n in names if n != a]))
        ins = [(a, avail[a]), (b, avail[b])]
        used = sorted({l for _, ls in ins for l in ls})
        out = "".join(l for l in used if rng.random() < 0.5)
        agg = str(rng.choice(ML_AGGS)) if len(out) < len(used) else "sum"
        join = str(rng.choice(["x0 * x1", "x0 + x1", "tanh(x0 - x1)", "exp(x0) * x1",
                               "where(x0 > x1, x0 * x1, x1)"]))
        steps.append((f"O{s}", out, ins, join, agg))
        avail[f"O{s}"] = out
    arrays = {n: rng.uniform(0.5, 1.5, size=shape) for n, shape in stored.items()}
    return arrays, index, reads, steps


@pytest.mark.filterwarnings("ignore::UserWarning")  # autograd: a loss that ignores a tensor
@pytest.mark.parametrize("seed", range(24))
def test_random_slice_gather_gradients(tmp_path, seed):
    arrays, index, reads, steps = ml_case(seed)
    con = tensordb.connect(tmp_path / "db")
    for n, a in {**arrays, **index}.items():
        con.load(n, a, tile=tuple(max(1, k // 2) for k in a.shape))  # boxes cut the tiles
    g = Graph()
    for into, out, ins, join, agg in steps:
        g.op(into, out, ins, join=join, agg=agg, store=False)
    last, out_last = steps[-1][0], steps[-1][1]
    g.op("L", "", [(last, out_last)], join="x0 * x0")
    wrt = list(arrays)
    g.grad("L", wrt, into=[f"g{n}" for n in wrt])
    con.run(g)

    def loss(**xs):
        env = {}
        for t, (text, ls, how) in reads.items():
            env[text] = xs[t][how[0]:how[1]] if isinstance(how, tuple) else \
                xs[t][index[how]] if how else xs[t]
        for into, out, ins, join, agg in steps:
            space_out = oracle_op(env, out, [(env[n], ls) for n, ls in ins], join, "sum") \
                if agg == "sum" else _ml_op(env, out, ins, join, agg)
            env[into] = space_out
        return anp.sum(env[last] * env[last])

    text = f"{reads}; " + "; ".join(f"{i}[{o}] = {a}({j} over {ins})" for i, o, ins, j, a in steps)
    _check_against_autograd(con, loss, arrays, wrt, text)


def _ml_op(env, out, ins, join, agg):
    labels = list(out) + sorted({l for _, ls in ins for l in ls} - set(out))
    values = []
    for n, ls in ins:
        a, ls = _diagonals(env[n], ls)
        order = sorted(range(len(ls)), key=lambda d: labels.index(ls[d]))
        x = anp.transpose(a, order) if len(ls) > 1 else a
        values.append(anp.reshape(x, [SIZES[l] if l in ls else 1 for l in labels]))
    names = {f"x{n}": v for n, v in enumerate(values)}
    space = eval(join, {"__builtins__": {}}, {**NP, **names})  # noqa: S307 - our own strings
    space = space + anp.zeros([SIZES[l] for l in labels])
    return _oracle_agg(space, agg, tuple(range(len(out), len(labels))))
