"""A dense, obviously-correct reference for the extended einsum, used as the tests' oracle.

It materialises the whole join space with numpy broadcasting (fine for the tiny sizes of tests),
evaluates the join with plain numpy functions, and reduces with the aggregate's ufunc.
"""
from __future__ import annotations

import numpy as np

UNARY = {"neg": np.negative, "abs": np.abs, "relu": lambda x: np.maximum(x, 0), "sqrt": np.sqrt,
         "tanh": np.tanh, "sin": np.sin, "square": np.square, "exp": np.exp, "log": np.log,
         "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "cos": np.cos}
BINARY = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.true_divide,
          "max": np.maximum, "min": np.minimum, "pow": np.power}
REDUCE = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}


def evaluate(expr, values):
    kind = type(expr).__name__
    if kind == "Input":
        return values[expr.index]
    if kind == "Const":
        return expr.value
    args = [evaluate(a, values) for a in expr.args]
    return (UNARY[expr.fn] if len(args) == 1 else BINARY[expr.fn])(*args)


def extended_einsum(out_labels, operands, join, agg, dtype):
    """operands: list of (array, labels). Returns the dense result."""
    sizes = {}
    for a, ls in operands:
        for l, n in zip(ls, a.shape):
            sizes[l] = n
    labels = list(out_labels) + [l for _, ls in operands for l in ls if l not in out_labels]
    labels = list(dict.fromkeys(labels))
    views = []
    for a, ls in operands:
        uniq = list(dict.fromkeys(ls))
        if len(uniq) != len(ls):  # a repeated label: take the diagonal
            letters = {l: chr(97 + i) for i, l in enumerate(uniq)}
            a = np.einsum("".join(letters[l] for l in ls) + "->" + "".join(letters[l] for l in uniq), a)
        order = sorted(range(len(uniq)), key=lambda i: labels.index(uniq[i]))
        a = np.transpose(a, order)
        shape = [sizes[l] if l in uniq else 1 for l in labels]
        views.append(a.reshape(shape))
    with np.errstate(all="ignore"):
        full = np.broadcast_to(np.asarray(evaluate(join, views)), [sizes[l] for l in labels])
        axes = tuple(range(len(out_labels), len(labels)))
        out = REDUCE[agg](full, axis=axes) if axes else full
    return np.asarray(out).astype(dtype)
