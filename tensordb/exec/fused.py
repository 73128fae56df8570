"""A join expression compiled once into one Python function of NumPy calls (issue 29).

``scalar.evaluate`` interprets the expression tree at every kernel call: a recursive call, a
list and a table lookup per node, 0.5 us each, 20 to 40 us of a small training step's kernels.
``compile_join`` writes the same calls out once, as the text of a function over the operand
arrays (``v[0]``, ``v[1]``, ...), and the kernel (exec/kernels.py) calls it for every tile of
the operation: a chain of elementwise functions is one call per tile. The text is generated
from the tree's shape only; every literal and every function is passed in as a name bound to
the object (no user text is ever part of it).

The answers are ``scalar.evaluate``'s, bit for bit and dtype for dtype, on NumPy arrays:
the same ufuncs in the same order on the same weak Python scalars, the outermost ufunc written
into ``out`` (cast unsafely), as ``evaluate`` writes it. What it leaves out is only what
cannot change a value or a dtype:

- ``_STOP(e)`` (the value itself; only its derivative is zero) is ``e``;
- ``e * 1`` and ``1 * e`` (a weak 1: Python's ``1``, or ``1.0`` on a float or complex ``e``),
  where ``e`` is an integer, float or complex value (``x * 1`` is ``x``, NaN, inf and -0.0
  included; on a bool it is an int64, so a bool keeps the product). An operand itself as the
  whole expression (``x0 * 1``) only where the result is reduced, which makes the new array:
  an elementwise kernel's result must be an array of its own, never its input. A digits step's
  LOGSUMEXP is ``MAX(x0 * 1)`` and ``SUM(EXP(x0 * 1 - m))``: 37 us a pass over 1347 x 10;
- ``x - x == 0`` of an integer, float or complex operand ``x`` (a LOGSUMEXP's guard of its
  row maximum, ``where(m - m == 0, m, 0)``) is ``isfinite(x)``, element for element and
  dtype for dtype, in one call (without the ignored floating-point error of ``inf - inf``);
- a unary ufunc of an array NumPy just made in the result's dtype is computed in place
  (``exp(t, out=t)``): no new buffer; the outermost one too where the result is only reduced
  and no ``out`` is given.

Each intermediate array is deleted after its last use (``del t3, t5``), as ``evaluate`` drops
a call's arguments once it is applied: the arrays alive at once are ``plan.kernel.live_arrays``,
the figure the memory budget reserves for a chunk. Kept until the function returned, a long
join held all of them (7 chunks instead of 3 for the 13 calls of
tests/exec/test_memory_chains.py's LONG: twice what the budget counted).

A literal subexpression (no operand) is computed once, when compiled, as ``evaluate`` would
(under ``np.errstate(all="ignore")`` as the kernels run it); one that raises is not compiled
(the kernel interprets the expression, and raises as before).
"""
from __future__ import annotations

import re
import warnings

import numpy as np

from ..plan import scalar

__all__ = ["compile_join", "views", "join"]

_KEEP_DTYPE_UNDER_ONE = "iufc"  # kinds for which x * 1 is x in value and dtype (weak int 1)


_UNSET = object()
_TEMP = re.compile(r"\bt\d+\b")  # the generated names of intermediate arrays (``_Gen.temp``)


def views(spec, arrays):
    """The operands ``arrays`` of kernel ``spec`` (exec/kernels.py ``KernelSpec``) as views in
    its join space (aggregated labels first, each operand's absent labels of extent 1), and
    the space's extents. Where each operand's axes go is worked out once per operand shapes
    and kept in the spec (a training step's tiles keep their shapes)."""
    xp = spec.xp
    key = tuple(a.shape for a in arrays)
    lay = spec._layouts.get(key)
    if lay is None:
        ext, steps = {}, []
        for a, (uniq, diag), (order, present) in zip(arrays, spec.unique, spec.placed):
            for l, n in zip(uniq, a.shape if diag is None else xp.einsum(diag, a).shape):
                ext[l] = n
            shape = tuple(ext[l] if l in present else 1 for l in spec.space)
            steps.append((diag, None if order == tuple(range(len(order))) else order, shape))
        lay = (steps, [ext[l] for l in spec.space])
        if len(spec._layouts) < 64:
            spec._layouts[key] = lay
    out = []
    for a, (diag, order, shape) in zip(arrays, lay[0]):
        if diag is not None:
            a = xp.einsum(diag, a)
        if order is not None:
            a = a.transpose(order)
        out.append(a if a.shape == shape else a.reshape(shape))
    return out, list(lay[1])


def join(spec, values, out=None, reduced: bool = False):
    """Kernel ``spec``'s join on ``values`` (``scalar.evaluate``'s answer): on the CPU by the
    function compiled from it once per operand dtypes and kept in the spec; ``reduced``: the
    value is only reduced, so it may be an operand itself."""
    if spec.xp is not np:
        return scalar.evaluate(spec.op.join, values, spec.xp, out=out)
    key = (reduced,) + tuple(v.dtype for v in values)
    fn = spec._fused.get(key, _UNSET)
    if fn is _UNSET:
        fn = compile_join(spec.op.join, key[1:], reduced=reduced) \
            if all(isinstance(v, np.ndarray) for v in values) else None
        if len(spec._fused) < 16:
            spec._fused[key] = fn
    if fn is None:
        return scalar.evaluate(spec.op.join, values, np, out=out)
    return fn(values, out)


def compile_join(expr, dtypes, *, reduced: bool = False):
    """A function ``f(values, out=None)`` computing ``scalar.evaluate(expr, values, np, out)``
    on NumPy arrays of ``dtypes``; ``reduced``: the result is only reduced (never kept as a
    tile), so it may be an operand itself. None where the expression is not compiled."""
    try:
        gen = _Gen(tuple(np.dtype(d) for d in dtypes), reduced)
        body = gen.node(expr, top=True)
    except _NotCompiled:
        return None
    lines = ["def f(v, out=None):"] + ["    " + line for line in _freeing(gen.lines, body)]
    lines.append(f"    return {body}")
    space = dict(gen.names)
    space["ndarray"] = np.ndarray
    exec("\n".join(lines), space)  # noqa: S102 - text made of generated names only
    fn = space["f"]
    fn.source = "\n".join(lines)
    return fn


def _freeing(lines, body: str) -> list[str]:
    """``lines`` (``tN = ...``) with each intermediate deleted after the line that reads it
    last (those the returned ``body`` reads are freed by the return)."""
    last = {}
    for n, line in enumerate(lines):
        for name in _TEMP.findall(line.split(" = ", 1)[1]):
            last[name] = n
    returned = set(_TEMP.findall(body))
    out = []
    for n, line in enumerate(lines):
        out.append(line)
        done = sorted((t for t, at in last.items() if at == n and t not in returned),
                      key=lambda t: int(t[1:]))
        if done:
            out.append("del " + ", ".join(done))
    return out


class _NotCompiled(Exception):
    pass


class _Gen:
    def __init__(self, dtypes, reduced: bool) -> None:
        self.dtypes, self.reduced = dtypes, reduced
        self.lines: list[str] = []
        self.names: dict[str, object] = {}
        self.count = 0

    def name(self, obj, prefix: str) -> str:
        n = f"{prefix}{len(self.names)}"
        self.names[n] = obj
        return n

    def temp(self, text: str) -> str:
        t = f"t{self.count}"
        self.count += 1
        self.lines.append(f"{t} = {text}")
        return t

    def dtype(self, expr):
        try:
            return scalar.dtype_of(expr, self.dtypes)
        except Exception:  # noqa: BLE001 - NumPy refuses it: interpreted, and raises there
            raise _NotCompiled from None

    def node(self, expr, top: bool = False) -> str:
        """The name (or the expression text, for the outermost call) of ``expr``'s value."""
        if isinstance(expr, scalar.Input):
            if expr.index >= len(self.dtypes):
                raise _NotCompiled
            return f"v[{expr.index}]"
        if isinstance(expr, (scalar.Const, scalar.Param)):
            return self.name(expr.value, "k")
        if not expr.inputs():  # a literal subexpression: its value, once
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    value = scalar.evaluate(expr, [])
                except Exception:  # noqa: BLE001 - raised at each call, as evaluate raises
                    raise _NotCompiled from None
            return self.name(value, "k")
        if expr.fn == "_stop":
            return self.node(expr.args[0], top)
        finite = self._finite_test(expr)
        if finite is not None:  # x - x == 0: whether x is finite, in one call
            f = self.name(np.isfinite, "f")
            a = self.node(finite)
            if top:
                return f"{f}({a}) if out is None else {f}({a}, out=out, casting='unsafe')"
            return self.temp(f"{f}({a})")
        kept = self._times_one(expr, top)
        if kept is not None:
            return self.node(kept, top)
        spec = scalar.FUNCTIONS[expr.fn]
        fn = spec.ufunc
        args = [self.node(a) for a in expr.args]
        f = self.name(fn, "f")
        call = f"{f}({', '.join(args)}"
        if top:
            if self.reduced and self._in_place(fn, expr):
                # only reduced: a new array of the result's dtype may take its own result (the
                # EXP of a LOGSUMEXP's SUM: no second 1347 x 10 buffer a step)
                a = args[0]
                return (f"({call}, out={a}) if type({a}) is ndarray else {call})) if out is None "
                        f"else {call}, out=out, casting='unsafe')")
            if isinstance(fn, np.ufunc):
                return (f"{call}) if out is None else {call}, out=out, casting='unsafe')")
            if fn is scalar._relu:
                mx = self.name(np.maximum, "f")
                return (f"{call}) if out is None or not isinstance({args[0]}, ndarray) "
                        f"else {mx}({args[0]}, 0, out=out, casting='unsafe')")
            return call + ")"
        if self._in_place(fn, expr):
            a = args[0]  # a new array of the result's dtype, read by this call only
            return self.temp(f"{call}, out={a}) if type({a}) is ndarray else {call})")
        return self.temp(call + ")")

    def _in_place(self, fn, expr) -> bool:
        """May unary ufunc ``fn`` of call ``expr`` write its result over its argument: a new
        array of the result's dtype, read by this call only?"""
        return isinstance(fn, np.ufunc) and fn.nin == 1 and \
            isinstance(expr.args[0], scalar.Call) and self._fresh(expr.args[0]) and \
            self.dtype(expr.args[0]) == self.dtype(expr)

    def _fresh(self, expr) -> bool:
        """Does ``expr`` (a call) evaluate to an array made for it (no operand, no literal)?"""
        while isinstance(expr, scalar.Call):
            if expr.fn == "_stop":
                expr = expr.args[0]
                continue
            kept = self._times_one(expr, False)
            if kept is None:
                return bool(expr.inputs())
            expr = kept
        return False

    def _finite_test(self, expr):
        """The operand ``x`` of ``x - x == 0`` (a LOGSUMEXP's guard of its row maximum:
        ``where(m - m == 0, m, 0)``) where ``x`` is an integer, float or complex input: the
        test is then NumPy's ``isfinite(x)``, element for element (``x - x`` is 0 exactly for
        a finite ``x``, NaN for NaN and for an infinity; for a complex ``x`` each part so; an
        integer's is 0), in one call instead of two, without the floating-point error of
        ``inf - inf`` that the kernels ignore. None otherwise."""
        if expr.fn != "==" or len(expr.args) != 2:
            return None
        diff, zero = expr.args
        if not isinstance(zero, scalar.Const) or type(zero.value) not in (int, float) or \
                zero.value != 0 or not isinstance(diff, scalar.Call) or diff.fn != "-" or \
                len(diff.args) != 2:
            return None
        a, b = diff.args
        if not isinstance(a, scalar.Input) or not isinstance(b, scalar.Input) or \
                a.index != b.index or a.index >= len(self.dtypes):
            return None
        return a if self.dtypes[a.index].kind in "iufc" else None

    def _times_one(self, expr, top: bool):
        """The factor ``e`` of ``e * 1`` / ``1 * e`` where leaving the 1 out changes nothing."""
        if expr.fn != "*":
            return None
        for one, e in ((expr.args[1], expr.args[0]), (expr.args[0], expr.args[1])):
            if not isinstance(one, scalar.Const) or type(one.value) not in (int, float) or \
                    one.value != 1:
                continue
            if isinstance(e, scalar.Input) and top and not self.reduced:
                continue  # the operand itself would be the tile: keep the product
            if isinstance(e, scalar.Const) or not e.inputs():
                continue
            kinds = _KEEP_DTYPE_UNDER_ONE if type(one.value) is int else "fc"
            d = self.dtype(e)
            if d.kind in kinds and self.dtype(expr) == d:
                return e
        return None
