"""Checked steps -> the ``EinGraph``: the binder's last part, which checks nothing.

Both of the binder's front ends (statements: ``group.py``/``binder.py``; the Python API's
``Graph``: ``graph.py``) resolve names and check labels, sizes and dtypes, with a caret on every
error, and hand over ``BoundStep``s. The emitter only builds operations from them: a product of
several stored finite tensors is split pairwise (opt_einsum's path), a product of tensors under
SUM casts every operand to the result dtype (np.einsum's rule), and a result that replaces a
tensor the graph reads is computed under an internal name (``A'``) and stored under its own.
A ``GradStep`` (checked GRADs of one loss) becomes the backward operations of the operations
emitted so far (``plan.grad.backward``), appended to the same graph.

>>> from tensordb.plan.ir import TensorInfo
>>> from tensordb.plan import scalar
>>> e = Emitter(None)
>>> e.read(TensorInfo("A", (2, 3), "float64"))
>>> e.add(BoundStep("B", ("i",), (("A", ("i", "j")),), scalar.product(1), "sum", True,
...                 (("i", 2), ("j", 3)), "float64"))
>>> g = e.graph()
>>> [(str(op.output), op.out_labels, op.agg) for op in g.ops], g.outputs
([('B', ('i',), 'sum')], ('B',))
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import Error, ProgrammingError
from ..geometry import BoxName, GatherName, IotaName, OneHotName
from ..plan import scalar
from ..plan.builder import split_pairwise
from ..plan.fills import describe, op_fill
from ..plan.grad import backward
from ..plan.ir import EinGraph, EinOp, Operand, TensorInfo
from ..plan.names import TensorRef
from ..plan.select import Selection, box_scatter, gather_scatter

__all__ = ["BoundStep", "GradStep", "Emitter"]


@dataclass(frozen=True)
class BoundStep:
    """One checked operation ``into[out_labels] = agg(join(inputs))``: names resolved (to stored
    tensors the binder handed to ``Emitter.read``, or earlier steps' results), one label per
    dimension of every input, ``sizes`` of every label, the result ``dtype`` inferred."""

    into: str                                     # a TensorRef for a version or temporary
    out_labels: tuple[str, ...]
    inputs: tuple[tuple[str, tuple[str, ...]], ...]
    join: scalar.Expr
    agg: str
    store: bool
    sizes: tuple[tuple[str, int], ...]
    dtype: str


@dataclass(frozen=True)
class GradStep:
    """Checked GRADs of one scalar ``loss`` (an earlier step's result): per tensor, the name its
    gradient is computed under and whether it is stored. One backward pass computes them all."""

    loss: str
    wrt: tuple[tuple[str, str, bool], ...]        # (tensor, into, store)
    sources: tuple = ()                           # per wrt, (statement, span) of its GRAD


class Emitter:
    """The operations emitted so far, and the names they read and compute."""

    def __init__(self, catalog) -> None:
        self.catalog = catalog  # for the finiteness facts of stored tensors (``open``), if any
        self.stored: dict[str, TensorInfo] = {}   # stored tensors the binder resolved
        self.inputs: dict[str, TensorInfo] = {}   # ...that the emitted operations read, in order
        self.known: dict[str, str] = {}           # name -> dtype, of inputs and results
        self.ops: list[EinOp] = []
        self.outputs: list[str] = []
        self.alias: dict[str, TensorRef] = {}     # a name replaced after it was read -> its result
        self.passes: dict[str, int] = {}          # loss -> backward passes of it so far

    def read(self, info: TensorInfo) -> None:
        """A stored tensor the binder resolved (its name, shape and dtype, read once)."""
        self.stored.setdefault(info.name, info)

    def graph(self) -> EinGraph:
        return EinGraph(tuple(self.inputs.values()), tuple(self.ops), tuple(self.outputs))

    def add(self, step: BoundStep | GradStep) -> None:
        """Emit one step's operations (a product of several operands split pairwise)."""
        if isinstance(step, GradStep):
            self._grad(step)
            return
        names = [self.alias.get(t, t) for t, _ in step.inputs]
        labels = [list(ls) for _, ls in step.inputs]
        for t in names:
            if t not in self.known:
                self.inputs[t] = self.stored[t]
                self.known[t] = self.stored[t].dtype
        given = dict(step.sizes)  # in the order the labels are first used by the inputs
        sizes = {l: given[l] for ls in labels for l in ls}
        join = step.join
        into = self._result_name(step.into)
        # A product of tensors (no literal) under SUM is np.einsum: every operand is cast to
        # the result dtype first, whatever the order the product is written in. A tensor used
        # twice (A[i,j] * A[i,j] * B[k], one input of the join) is two operands of the einsum.
        factors = scalar.product_factors(join) if step.agg == "sum" else None
        einsum = factors is not None and sorted(set(factors)) == list(range(len(names)))
        if einsum and len(factors) != len(names):
            names, labels = [names[k] for k in factors], [labels[k] for k in factors]
            join = scalar.product(len(factors))
        # A product of three or more is split into pairs only where that cannot change the
        # answer: grouping the sum over a pair first differs from summing the products next to
        # an inf (inf * (2 - 1) is inf, 2 * inf - 1 * inf is NaN), so every operand must be a
        # stored tensor that the catalog knows to be finite.
        if einsum and (len(names) <= 2 or all(n in self.inputs and self._finite(n) for n in names)):
            pieces = split_pairwise(into, labels, list(step.out_labels), sizes, names)
        else:
            pieces = [(into, list(step.out_labels), list(zip(names, labels)))]
        for name, out_labels, operands in pieces:
            self._emit(name, out_labels, operands, sizes, join if len(pieces) == 1 else None,
                       step.agg, step.dtype, cast=einsum)
        if step.store:
            self.outputs.append(into)

    def _grad(self, step: GradStep) -> None:
        """The backward pass of ``step.loss`` (plan/grad.py), after the operations so far. A
        tensor read through slices or gathers gets the gradients of those boxes scattered back
        onto its shape (plan/select.py), summed with the gradient of its whole reads."""
        wrt, views, results = [], [], []
        for tensor, into, store in step.wrt:
            t = self.alias.get(tensor, tensor)
            into = self._result_name(into)
            results.append((into, store))
            boxes = [n for n in self.inputs if isinstance(n, (BoxName, GatherName)) and n.base == t]
            direct = any(o.tensor == t for op in self.ops for o in op.inputs)
            if t not in self.known and (direct or not boxes):
                self.inputs[t] = self.stored[t]
                self.known[t] = self.stored[t].dtype
            if not boxes:
                wrt.append((t, into))
                continue
            parts = []
            if direct:
                parts.append(into.temporary(1))
                wrt.append((t, parts[-1]))
            for box in boxes:
                wrt.append((box, into.temporary(len(parts) + 1)))
                parts.append((box, wrt[-1][1]))
            views.append((t, into, parts))
        shapes = {n: (i.shape, i.dtype) for n, i in self.inputs.items()}
        loss = self.alias.get(step.loss, step.loss)
        self.passes[loss] = self.passes.get(loss, 0) + 1  # a loss may have several passes
        fills = {n: f for n in shapes if (f := self._fill(n))}
        ops = backward(self.ops, shapes, loss, wrt, self.passes[loss], fills)
        if fills:
            check_fills(self.ops, ops, fills, step)
        for op in ops:
            for o in op.inputs:  # every stored tensor they read is an input of the graph
                if o.tensor not in self.known:
                    self.inputs[o.tensor] = self.stored[o.tensor]
                    self.known[o.tensor] = self.stored[o.tensor].dtype
            self.ops.append(op)
            self.known[op.output] = op.dtype
        for t, into, parts in views:
            self._scatter(t, into, parts)
        self.outputs.extend(into for into, store in results if store)

    def _scatter(self, t: str, into: TensorRef, parts: list) -> None:
        """``into``, the gradient of ``t``: the sum of ``parts``, each the gradient of t's whole
        reads (a name) or of one of its boxes or gathers ``(box, its gradient)``, scattered."""
        info = self.stored[t]
        dtype = info.dtype if np.dtype(info.dtype).kind == "f" else "float64"
        last = len(parts) + 2
        names = []
        for k, part in enumerate(parts):
            if not isinstance(part, tuple):
                names.append(part)
                continue
            box, grad = part
            if isinstance(box, BoxName):
                sel = box_scatter(info.shape, box.box, dtype).with_source(grad)
            else:
                sel = self._scaled_scatter(info, box, grad, dtype) or gather_scatter(
                    info.shape, box.index, box.index_shape).with_source(grad)
            name = into if len(parts) == 1 else into.temporary(last + k)
            self._select(name, sel, dtype)
            names.append(name)
        if len(parts) > 1:
            labels = tuple(f"d{i}" for i in range(len(info.shape)))
            join: scalar.Expr = scalar.Input(0)
            for k in range(1, len(names)):
                join = scalar.Call("+", (join, scalar.Input(k)))
            op = EinOp(into, labels, tuple(Operand(n, labels) for n in names),
                       tuple(zip(labels, info.shape)), join, "sum", dtype,
                       tuple(self.known[n] for n in names), backward=True)
            self.ops.append(op)
            self.known[into] = dtype

    def _scaled_scatter(self, info: TensorInfo, box: GatherName, grad: str, dtype: str):
        """The scatter-add of ``grad`` onto the rows a vector index names, fused with the
        operation that made ``grad`` when that is a row-scaled copy of another tensor,
        ``grad[n,f] = g[n] * X[n,f]`` (GRAD's gradient of one factor of a product of gathers,
        ``SUM_f U[iu[n],f] * V[iv[n],f]``): one operation ``SUM_n X[n,f] * H[n,r] * g[n]``
        with H the index's one-hot rows, an SpMM whose sparse entries are scaled by g
        (plan/kernel.py), so the lookups x columns product is never stored. None where it
        does not apply (the plain scatter-add of ``grad`` then)."""
        if len(box.index_shape) != 1:
            return None
        op = next((o for o in self.ops if o.output == grad), None)
        j = op.join if op is not None else None
        if op is None or not op.backward or op.agg_labels or len(op.inputs) != 2 or \
                op.writes_diagonal or grad in self.outputs or op.dtype != dtype or \
                any(d != dtype for d in (op.in_dtypes or ())) or \
                not (isinstance(j, scalar.Call) and j.fn == "*" and len(j.args) == 2 and
                     all(isinstance(a, scalar.Input) for a in j.args) and
                     {a.index for a in j.args} == {0, 1}) or \
                any(o.tensor == grad for other in self.ops for o in other.inputs):
            return None
        n, lab = op.out_labels[0], op.out_labels
        vec = [o for o in op.inputs if o.labels == (n,)]
        full = [o for o in op.inputs if o.labels == lab]
        if len(vec) != 1 or len(full) != 1 or len(lab) != len(info.shape):
            return None
        rest = tuple(f"a{k}" for k in range(1, len(info.shape)))
        sizes = {"b0": box.index_shape[0], "r": info.shape[0]} | dict(zip(rest, info.shape[1:]))
        self.ops.remove(op)
        return Selection(("r",) + rest, ((full[0].tensor, ("b0",) + rest),
                                        (OneHotName(box.index, box.index_shape, info.shape[0]),
                                         ("b0", "r")), (vec[0].tensor, ("b0",))),
                         scalar.product(3), sizes, "sum")

    def _select(self, name: TensorRef, sel, dtype: str, backward: bool = True) -> None:
        """One operation of plan/select.py (its positions made inputs of the graph)."""
        for t, _ in sel.inputs:
            if isinstance(t, (IotaName, OneHotName)) and t not in self.known:
                kind = "int64" if isinstance(t, IotaName) else "bool"
                self.inputs[t] = TensorInfo(t, t.shape, kind)
                self.known[t] = kind
            elif t not in self.known:
                self.inputs[t] = self.stored[t]
                self.known[t] = self.stored[t].dtype
        product = sel.agg == "sum" and scalar.product_factors(sel.join) is not None
        op = EinOp(name, sel.out_labels, tuple(Operand(t, ls) for t, ls in sel.inputs),
                   tuple(sel.sizes.items()), sel.join, sel.agg, dtype,
                   # a product (a gather's scatter-add): np.einsum's rule, every operand cast
                   # to the result dtype, so that it runs as a matrix product
                   tuple(dtype if product else self.known[t] for t, _ in sel.inputs),
                   backward=backward)
        self.ops.append(op)
        self.known[name] = dtype

    def _fill(self, name: str) -> float:
        """A stored tensor's fill value (plan/fills.py; 0 for a result, or without a catalog)."""
        meta = getattr(self.catalog, "meta", None)
        if meta is None or name not in self.stored or type(name) is not str:
            return 0.0  # a box, gather, one-hot or iota read: derived, no catalog row of its own
        try:
            return float(getattr(meta(name), "fill", 0.0) or 0.0)
        except Error:
            return 0.0

    def _finite(self, name: str) -> bool:
        """No stored tile holds NaN or inf (a catalog without per-tile facts: assumed)."""
        opener = getattr(self.catalog, "open", None)
        return opener is None or opener(name).facts()[0]

    def _result_name(self, name: str) -> TensorRef:
        """The name a step computes under: its own, or an internal one when it replaces a
        tensor this graph reads (stored under the tensor's name all the same)."""
        into = TensorRef.of(name)
        if into in self.inputs:
            into = self.alias[name] = into.internal_copy()
        return into

    def _emit(self, name: str, out_labels, operands, sizes: dict[str, int],
              join: scalar.Expr | None, agg: str, dtype: str, cast: bool = False) -> None:
        """One EinOp; ``join`` None: a pairwise step of a split product; ``cast``: a product of
        tensors, whose operands are all cast to the result dtype (np.einsum's rule)."""
        used = {l for _, ls in operands for l in ls}
        # Every pairwise step computes in the whole product's dtype, as np.einsum does (it casts
        # every operand to the result type): a float32 x float32 step under a float64 result
        # would lose float64's precision.
        in_dtypes = tuple(dtype if join is None or cast else self.known[t] for t, _ in operands)
        j = join if join is not None else scalar.product(len(operands))
        op = EinOp(name, tuple(out_labels), tuple(Operand(t, tuple(ls)) for t, ls in operands),
                   tuple((l, sizes[l]) for l in sizes if l in used), j, agg, dtype, in_dtypes)
        self.ops.append(op)
        self.known[name] = dtype


def check_fills(forward, ops, fills, step: GradStep) -> None:
    """Refuse a GRAD whose backward pass reads a tensor of another fill than 0 where the
    gradient keeps no fill (plan/fills.py): NaN wherever that tensor has no entry, as numpy and
    autograd would compute on the densified tensor (``EXP(-D * D)``'s derivative ``-2 D EXP(-D *
    D)`` is ``inf * 0`` at an absent entry of fill +inf). A ProgrammingError with a caret on the
    GRAD, naming the tensor, its fill and the backward operation: never a silent NaN. A forward
    operation that keeps no fill is left to the planner, which refuses it as before."""
    out = dict(fills)
    for op in forward:
        f_in = [out.get(o.tensor, 0.0) for o in op.inputs]
        try:
            out[op.output] = op_fill(op, f_in) if any(f_in) else 0.0
        except ProgrammingError:
            return
    for op in ops:
        f_in = [out.get(o.tensor, 0.0) for o in op.inputs]
        try:
            out[op.output] = op_fill(op, f_in) if any(f_in) else 0.0
        except ProgrammingError:
            bad = next(t for t in dict.fromkeys(o.tensor for o in op.inputs) if out.get(t, 0.0))
            statement, span = step.sources[0] if step.sources else (None, None)
            names = ", ".join(f"GRAD({step.loss}, {t})" for t, _, _ in step.wrt)
            raise ProgrammingError(
                f"{names}: the gradient reads {bad}, of fill value {out[bad]}, and is NaN "
                f"wherever {bad} has no entry (the backward operation {describe(op)} at the "
                "fills is NaN): it has no value there", statement=statement, span=span,
                hint=f"the absent entries of {bad} are {out[bad]}: write the loss so that its "
                     "derivative there is finite (MIN and MAX of sums pass nothing to them), "
                     "or store the tensor with fill 0") from None
