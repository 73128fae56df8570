"""The extended einsum IR: one operation kind, and a DAG of them (an EinGraph).

    out[o] = AGG over a of JOIN(in_1[labels_1], ..., in_n[labels_n])

Output labels ``o`` are listed on the operation; every other label is aggregated with ``agg``.
An output label may repeat (``out[i,i] = ...``, made by the backward pass only): the operation
writes a diagonal, and every element off it is 0 (the gradient of a diagonal read ``M[i,i]``).
Nodes are frozen dataclasses that check themselves when built.

>>> op = EinOp.contraction("C", "ik", [("A", "ij"), ("B", "jk")], {"i": 2, "j": 3, "k": 4})
>>> op.agg_labels, op.out_shape
(('j',), (2, 4))
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Iterable, Mapping, Sequence

import numpy as np

from ..dtypes import check_dtype
from ..errors import BinderError
from . import scalar
from .aggregates import AGGREGATES, AGGS, ARG_AGGS, empty_aggregate
from .names import TensorRef
from .scalar import Expr

__all__ = ["Operand", "EinOp", "TensorInfo", "EinGraph"]


@lru_cache(maxsize=256)
def _dtype_name(dtype) -> str:
    """``np.dtype(dtype).name``, kept: NumPy builds the name anew on each ask, and binding a
    training step (its backward included) asks thousands of times."""
    return np.dtype(dtype).name


@dataclass(frozen=True)
class Operand:
    """One input of an operation: a tensor name and one label per dimension."""

    tensor: str
    labels: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", tuple(self.labels))


@dataclass(frozen=True)
class EinOp:
    """One extended einsum. ``sizes`` maps every label to its size; ``dtype`` is the result dtype.
    ``output`` is a ``TensorRef`` (a plain name becomes one)."""

    output: TensorRef
    out_labels: tuple[str, ...]
    inputs: tuple[Operand, ...]
    sizes: tuple[tuple[str, int], ...]
    join: Expr
    agg: str | None = "sum"
    dtype: str = "float64"
    in_dtypes: tuple[str, ...] = ()   # the inputs' dtypes (empty: all ``dtype``)
    backward: bool = False            # an operation of a backward pass (GRAD, plan/grad.py)

    def __post_init__(self) -> None:
        object.__setattr__(self, "output", TensorRef.of(self.output))
        object.__setattr__(self, "out_labels", tuple(self.out_labels))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "sizes", tuple((str(k), int(v)) for k, v in dict(self.sizes).items()))
        if not self.inputs:
            raise BinderError(f"{self.output}: an operation needs at least one input")
        used = {l for o in self.inputs for l in o.labels}
        orphan = [l for l in self.out_labels if l not in used]
        if orphan:
            raise BinderError(f"{self.output}: output label(s) {', '.join(orphan)} appear in no input")
        size = dict(self.sizes)
        missing = [l for l in used if l not in size]
        if missing or any(v < 0 for v in size.values()):
            raise BinderError(f"{self.output}: no valid size for label(s) {', '.join(missing)}")
        bad = [i for i in self.join.inputs() if not 0 <= i < len(self.inputs)]
        if bad:
            raise BinderError(f"{self.output}: join refers to input x{bad[0]}, but there are "
                              f"{len(self.inputs)} inputs")
        if self.agg_labels and self.agg not in AGGS:
            raise BinderError(f"{self.output}: unknown aggregate {self.agg!r}",
                              hint=f"valid aggregates: {', '.join(AGGS)}")
        if not self.agg_labels:
            object.__setattr__(self, "agg", None)
        if self.agg in ARG_AGGS and (len(self.agg_labels) != 1
                                     or np.dtype(self.dtype) != np.int64):
            raise BinderError(f"{self.output}: {self.agg.upper()} aggregates one label into an "
                              f"int64 index, not {', '.join(self.agg_labels)} into {self.dtype}")
        empty = [l for l in self.agg_labels if size[l] == 0]
        if empty and AGGREGATES[self.agg].identity is None:
            raise empty_aggregate(self.agg, empty, self.describe())
        check_dtype(self.dtype, self.output)
        object.__setattr__(self, "in_dtypes", tuple(_dtype_name(d) for d in self.in_dtypes))
        if self.in_dtypes and len(self.in_dtypes) != len(self.inputs):
            raise BinderError(f"{self.output}: {len(self.in_dtypes)} input dtypes for "
                              f"{len(self.inputs)} inputs")

    @staticmethod
    def contraction(output: str, out_labels: Iterable[str], inputs: Sequence[tuple[str, Iterable[str]]],
                    sizes: Mapping[str, int], *, join: Expr | None = None, agg: str = "sum",
                    dtype: str = "float64") -> "EinOp":
        ops = tuple(Operand(t, tuple(ls)) for t, ls in inputs)
        return EinOp(output, tuple(out_labels), ops, tuple(sizes.items()),
                     join if join is not None else scalar.product(len(ops)), agg, dtype)

    # -- derived views -------------------------------------------------------------------------
    @property
    def size(self) -> dict[str, int]:
        return dict(self.sizes)

    @property
    def agg_labels(self) -> tuple[str, ...]:
        seen: list[str] = []
        for o in self.inputs:
            for l in o.labels:
                if l not in self.out_labels and l not in seen:
                    seen.append(l)
        return tuple(seen)

    @property
    def free_labels(self) -> tuple[str, ...]:
        """The output labels, each once (they differ from ``out_labels`` for a diagonal write)."""
        return tuple(dict.fromkeys(self.out_labels))

    @property
    def writes_diagonal(self) -> bool:
        """An output label repeats: only the diagonal is written, the rest is 0."""
        return len(self.free_labels) != len(self.out_labels)

    def without_diagonal(self) -> "EinOp":
        """The operation writing each output label once: what a diagonal write computes before
        it places the values on the diagonal (exec/kernels.py)."""
        if not self.writes_diagonal:
            return self
        return replace(self, out_labels=self.free_labels)

    @property
    def labels(self) -> tuple[str, ...]:
        """Every label once: output labels first, then aggregated labels in order of appearance."""
        return self.free_labels + self.agg_labels

    @property
    def out_shape(self) -> tuple[int, ...]:
        s = self.size
        return tuple(s[l] for l in self.out_labels)

    @property
    def flops(self) -> int:
        """Estimated floating-point operations: 2 per element of the join space for a product."""
        s = self.size
        space = int(np.prod([s[l] for l in self.labels], dtype=np.float64))
        return space * max(1, _count_ops(self.join))

    def describe(self) -> str:
        names = [f"{o.tensor}[{','.join(o.labels)}]" for o in self.inputs]
        body = scalar.render(self.join, names)
        if self.agg_labels:
            body = f"{self.agg.upper()}({body})"
        mark = "backward " if self.backward else ""
        return f"{mark}{self.output}[{','.join(self.out_labels)}] = {body}"


def _count_ops(expr: Expr) -> int:
    if isinstance(expr, scalar.Call):
        return 1 + sum(_count_ops(a) for a in expr.args)
    return 0


@dataclass(frozen=True)
class TensorInfo:
    """What the graph needs to know about a stored input tensor."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class EinGraph:
    """A DAG of operations in topological order over stored input tensors.

    ``outputs`` are the operation outputs that are stored; every other operation output is a
    temporary that lives only while the graph runs. An operation that replaces a tensor it also
    reads computes under an internal name (``A'``, its ``TensorRef`` marked internal) and is
    stored under the tensor's name (``stored_name``).
    """

    inputs: tuple[TensorInfo, ...]
    ops: tuple[EinOp, ...]
    outputs: tuple[str, ...]
    _index: dict = field(default=None, compare=False, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "ops", tuple(self.ops))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        shapes = {t.name: t.shape for t in self.inputs}
        produced: dict[str, EinOp] = {}
        for op in self.ops:
            if op.output in shapes or op.output in produced:
                raise BinderError(f"'{op.output}' is defined twice in one graph")
            for pos, o in enumerate(op.inputs):
                shape = shapes.get(o.tensor)
                if shape is None:
                    if o.tensor not in produced:
                        raise BinderError(f"{op.output}: unknown tensor '{o.tensor}'")
                    shape = produced[o.tensor].out_shape
                if len(shape) != len(o.labels):
                    raise BinderError(f"{op.output}: {o.tensor} has {len(shape)} dimension(s) "
                                      f"but is indexed with {len(o.labels)} label(s) "
                                      f"[{','.join(o.labels)}]")
                for axis, (l, n) in enumerate(zip(o.labels, shape)):
                    if op.size[l] != n:
                        raise BinderError(f"{op.output}: label '{l}' has size {op.size[l]}, but "
                                          f"{o.tensor} axis {axis} has size {n}")
            produced[op.output] = op
        missing = [n for n in self.outputs if n not in produced]
        if missing:
            raise BinderError(f"graph outputs {missing} are not produced by any operation")
        object.__setattr__(self, "_index", produced)

    def stored_name(self, output: str) -> str:
        """The catalog name an output is stored under (its name without the internal rename)."""
        ref = self._index[output].output
        return ref.name if ref.internal and ref.is_result else str(ref)

    def op(self, name: str) -> EinOp:
        return self._index[name]

    def producer(self, tensor: str) -> EinOp | None:
        return self._index.get(tensor)

    def consumers(self, tensor: str) -> list[EinOp]:
        return [op for op in self.ops if any(o.tensor == tensor for o in op.inputs)]

    def shape_of(self, tensor: str) -> tuple[int, ...]:
        if tensor in self._index:
            return self._index[tensor].out_shape
        return next(t.shape for t in self.inputs if t.name == tensor)

    def dtype_of(self, tensor: str) -> str:
        if tensor in self._index:
            return self._index[tensor].dtype
        return next(t.dtype for t in self.inputs if t.name == tensor)
