"""Consecutive einsum statements -> one ``EinGraph``, so the optimizer sees them all.

Names resolve to, in order: a result of an earlier statement of the same group, a LET (its steps
are inlined, never stored), a stored tensor. Reassigning a name inside a group makes the earlier
versions temporaries (``P.v1``); the last one is stored. A statement may replace a tensor the
group also reads (``P[i,j] = MIN(P[i,k] + P[k,j])``): the binder computes it under an internal
name and stores it as P.
"""
from __future__ import annotations

import difflib
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..dtypes import check_dtype
from ..errors import BinderError, CatalogError, GradientWarning, Span, warning_text
from ..geometry import BoxName, GatherName
from ..plan.ir import EinGraph, TensorInfo
from ..plan.names import TensorRef
from ..plan.select import box_select, gather_select
from ..dialect import ast as A
from .binder import Lowered, lower
from .emit import BoundStep, Emitter, GradStep

__all__ = ["GroupBinder", "LetDef"]


@dataclass(frozen=True)
class LetDef:
    """A LET: its source and statement, and the shape/dtype it had when defined."""

    script: str
    stmt: A.AssignStmt
    shape: tuple[int, ...]
    dtype: str

    @property
    def name(self) -> str:
        return self.stmt.target.name


@dataclass
class GroupBinder:
    """Bind statements one by one into checked ``steps``; ``eingraph`` emits them."""

    store: object
    lets: dict[str, LetDef]
    steps: list[BoundStep | GradStep] = field(default_factory=list)
    pieces: dict[str, dict[str, int]] = field(default_factory=dict)  # result -> {label: pieces}
    stored: dict[str, TensorInfo] = field(default_factory=dict)  # stored tensors resolved
    known: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)  # graph name -> shape, dtype
    current: dict[str, str] = field(default_factory=dict)  # lower(name) -> graph name
    outputs: list[str] = field(default_factory=list)  # user names stored by the group
    let_reads: dict[str, set[str]] = field(default_factory=dict)  # inlined LET -> names it reads
    _versions: int = 0

    # -- name resolution -----------------------------------------------------------------------
    def resolve(self, name: str, span: Span, script: str = "", box=None, gather=None):
        key = name.lower()
        if box is not None or gather is not None:
            return self._resolve_box(name, span, script, box, gather)
        if key in self.current:
            g = self.current[key]
            return (g, *self.known[g])
        if key in self.lets:
            return self._inline_let(self.lets[key])
        if self.store.has(name):
            meta = self.store.meta(name)
            info = TensorInfo(meta.name, tuple(int(n) for n in meta.shape),
                              check_dtype(meta.dtype, meta.name).name)
            self.stored[info.name] = info
            return info.name, info.shape, info.dtype
        stored = [m.name for m in self.store.list()]
        here = list(dict.fromkeys(  # LETs and results of this group, as they were spelled
            [d.name for d in self.lets.values()] +
            [str(getattr(g, "name", g)) for g in self.current.values()]))
        here = [n for n in here if n.lower() not in {s.lower() for s in stored}]
        known = stored + here
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6) or \
            difflib.get_close_matches(name.lower(), [k.lower() for k in known], n=1, cutoff=0.6)
        listed = "; ".join(part for part in (
            f"stored tensors: {', '.join(stored[:12])}" if stored else "",
            f"computed in this group: {', '.join(here[:12])}" if here else "") if part)
        hint = f"did you mean '{close[0]}'?" if close else \
            listed or "the database holds no tensors yet"
        raise CatalogError(f"unknown tensor '{name}'", statement=script or None, span=span, hint=hint)

    def _resolve_box(self, name: str, span: Span, script: str, box, gather=None):
        """A slice: the box of a stored tensor, read as an input of its own (geometry.BoxName),
        or of a LET or an earlier result, selected by an operation (``_slice``); a gather: the
        rows of a stored tensor that a stored index tensor selects (GatherName)."""
        here = name.lower() in self.current or name.lower() in self.lets
        if gather is None and here:
            return self._slice(*self.resolve(name, span, script), box)
        if gather is not None and here and gather.lower() not in self.current and \
                gather.lower() not in self.lets:
            return self._gather(*self.resolve(name, span, script),
                                *self.resolve(gather, span, script), span, script)
        for n in (name, gather) if gather is not None else ():
            key = n.lower()
            if key in self.current or key in self.lets:
                what = "a LET" if key in self.lets else "computed earlier in this group"
                verb = "gather with" if n == gather else "gather from"
                raise BinderError(f"cannot {verb} '{n}': it is {what}, and a gather reads "
                                  "stored tensors", statement=script or None, span=span,
                                  hint=f"store {n} first (CREATE TENSOR {n}[...] AS ...), then "
                                       "use it in a later statement")
        base, bshape, dtype = self.resolve(name, span, script)
        if gather is not None:
            index, ishape, _ = self.resolve(gather, span, script)
            b = GatherName(base, index, ishape, bshape)
            self.stored[b] = TensorInfo(b, b.shape, dtype)
            return b, b.shape, dtype
        b = BoxName(base, box)
        self.stored[b] = TensorInfo(b, b.shape, dtype)
        return b, b.shape, dtype

    def _slice(self, source: str, shape, dtype: str, box):
        """``box`` of ``source`` (a LET or an earlier result, not stored): a step of its own,
        an equality join on positions (plan/select.py), made once per source and box."""
        box = tuple((int(a), int(b)) for a, b in box)
        into = TensorRef(f"{source}.slice[{','.join(f'{a}:{b}' for a, b in box)}]")
        if into not in self.known:
            sel = box_select(shape, box, dtype).with_source(source)
            for t, _ in sel.inputs[1:]:
                self.stored[t] = TensorInfo(t, t.shape, "int64")
            self.steps.append(BoundStep(into, sel.out_labels, sel.inputs, sel.join, sel.agg,
                                        False, tuple(sel.sizes.items()), dtype))
            self.known[into] = (tuple(b - a for a, b in box), dtype)
        return (into, *self.known[into])

    def _gather(self, source: str, shape, dtype: str, index: str, ishape, idtype: str,
                span: Span, script: str):
        """``source[index]`` (``source`` a LET or an earlier result, ``index`` stored): a step
        of its own, an equality join with the index's one-hot rows (plan/select.py)."""
        if not shape or np.dtype(idtype).kind not in "iu":
            what = "a scalar" if not shape else f"of dtype {idtype}"
            raise BinderError(f"cannot gather from '{source}' by '{index}': "
                              f"{'the tensor is' if not shape else 'the index is'} {what}",
                              statement=script or None, span=span,
                              hint="a gather reads rows of a tensor by an integer tensor")
        into = TensorRef(f"{source}.gather[{index}]")
        if into not in self.known:
            sel = gather_select(shape, index, ishape, dtype).with_source(source)
            for t, _ in sel.inputs[1:]:
                self.stored[t] = TensorInfo(t, t.shape, "bool")
            self.steps.append(BoundStep(into, sel.out_labels, sel.inputs, sel.join, sel.agg,
                                        False, tuple(sel.sizes.items()), dtype))
            self.known[into] = (tuple(ishape) + tuple(shape[1:]), dtype)
        return (into, *self.known[into])

    def _resolver(self, script: str):
        return lambda name, span, box=None, gather=None: self.resolve(name, span, script, box, gather)

    def _inline_let(self, let: LetDef):
        """The LET's steps, here (a LET is computed where it is used). Inlined again, under a
        version of its name, when used after a name it reads was assigned (``stale``)."""
        key = let.name.lower()
        gname: str = let.name
        if gname in self.known:
            self._versions += 1
            gname = TensorRef(let.name, version=self._versions)
        if _is_grad(let.stmt):  # LET dW = GRAD(L, W): a gradient computed here, never stored
            self._add_grad(let.script, let.stmt, gname, store=False)
        else:
            self._add(lower(let.script, let.stmt, self._resolver(let.script), gname, store=False))
            self.current[key] = gname
        reads = {r.name.lower() for r in A.refs(let.stmt.expr)}
        for name in list(reads):
            reads |= self.let_reads.get(name, set())
        self.let_reads[key] = reads
        return (gname, *self.known[gname])

    def stale(self, name: str) -> None:
        """``name`` was (re)assigned: the LETs inlined so far that read it are inlined again
        where they are used next."""
        for key, reads in list(self.let_reads.items()):
            if name in reads and key in self.let_reads:
                del self.let_reads[key]
                self.current.pop(key, None)
                self.stale(key)

    def _add(self, low: Lowered) -> None:
        self.steps.extend(low.steps)
        last = low.steps[-1].into
        self.known[last] = (low.shape, low.dtype)
        if low.pieces:
            self.pieces[last] = dict(low.pieces)

    def eingraph(self) -> EinGraph:
        """The checked steps as operations (``emit.Emitter``: nothing is checked again)."""
        emitter = Emitter(self.store)
        for info in self.stored.values():
            emitter.read(info)
        for step in self.steps:
            emitter.add(step)
        return emitter.graph()

    # -- statements ----------------------------------------------------------------------------
    def add(self, script: str, stmt: A.AssignStmt, *, last: bool = True) -> None:
        """Bind one statement. ``last``: no later statement of the group assigns the same name."""
        t = stmt.target
        key = t.name.lower()
        if stmt.mode == "let":
            self._add_let(script, stmt)
            return
        if key in self.lets:
            raise BinderError(f"'{t.name}' is a LET intermediate, not a stored tensor",
                              statement=script, span=t.name_span,
                              hint=f"DROP TENSOR {t.name} to forget the LET, or pick another name")
        exists = key in self.current or self.store.has(t.name)
        if stmt.mode == "create" and exists:
            raise CatalogError(f"tensor '{t.name}' already exists", statement=script, span=t.name_span,
                               hint=f"CREATE OR REPLACE TENSOR {t.name} ..., or a plain assignment, "
                                    "replaces it")
        if not last:
            self._versions += 1
            gname, store = TensorRef(t.name, version=self._versions), False
        else:
            # Replacing a tensor the group also reads (P = MIN(P + P)) is fine: the binder computes
            # it under an internal name and stores it as P.
            gname, store = t.name, True
        if _is_grad(stmt):
            self._add_grad(script, stmt, gname, store)
        else:
            low = lower(script, stmt, self._resolver(script), gname, store=store)
            self._add(low)
        self.stale(key)
        self.current[key] = gname
        if store:
            self.outputs.append(t.name)

    def _add_grad(self, script: str, stmt: A.AssignStmt, gname: str, store: bool,
                  warn: bool = True) -> None:
        """``dW = GRAD(L, W)``: L a scalar computed earlier in the group, W a tensor (stored, a
        LET or a result). GRADs of one loss join the first one's backward pass."""
        call = stmt.expr
        if len(call.args) != 2 or not all(isinstance(a, A.Ref) and a.labels is None
                                         for a in call.args):
            bad = next((a for a in call.args if not (isinstance(a, A.Ref) and a.labels is None)),
                       call)
            raise BinderError("GRAD takes two tensor names: GRAD(loss, tensor)",
                              statement=script, span=bad.span if len(call.args) == 2 else call.span,
                              hint="write dW = GRAD(L, W): the gradient of the scalar L with "
                                   "respect to W, of W's shape")
        if stmt.pieces:
            raise BinderError("WITH (PIECES ...) does not apply to GRAD: the backward pass is "
                              "planned with the forward one", statement=script,
                              span=stmt.pieces[0].span)
        loss_ref, wrt_ref = call.args
        key = loss_ref.name.lower()
        if key not in self.current and key not in self.lets:
            where = "is a stored tensor" if self.store.has(loss_ref.name) else "is unknown"
            raise BinderError(f"GRAD: the loss '{loss_ref.name}' {where}; GRAD needs a loss "
                              "computed earlier in the same group of statements",
                              statement=script, span=loss_ref.span,
                              hint=f"compute {loss_ref.name} in the same execute call, script or "
                                   "BEGIN ... COMMIT block, with no other kind of statement "
                                   "between it and GRAD")
        loss, shape, dtype = self.resolve(loss_ref.name, loss_ref.name_span, script)
        if shape != ():
            raise BinderError(f"GRAD: the loss '{loss_ref.name}' is not a scalar: it has shape "
                              f"{shape}", statement=script, span=loss_ref.span,
                              hint=f"aggregate it to a scalar first, e.g. "
                                   f"{loss_ref.name}_sum = SUM({loss_ref.name}[...])")
        if np.dtype(dtype).kind != "f":
            raise BinderError(f"GRAD: the loss '{loss_ref.name}' is {dtype}, not a float",
                              statement=script, span=loss_ref.span)
        wrt, wshape, wdtype = self.resolve(wrt_ref.name, wrt_ref.name_span, script)
        index_of = [str(n) for st in self.steps if isinstance(st, BoundStep) for n, _ in st.inputs
                    if isinstance(n, GatherName) and n.index == wrt]
        if index_of:  # integer positions: no derivative (numpy's and autograd's answer)
            raise BinderError(f"GRAD with respect to '{wrt_ref.name}', the index of the gather "
                              f"{index_of[0]}: an index has no gradient", statement=script,
                              span=wrt_ref.span, hint="differentiate with respect to the "
                                                      "gathered tensor (its rows get the sum of "
                                                      "their lookups' gradients)")
        if warn:
            self._warn_unused(script, loss_ref, wrt_ref, loss, wrt)
        t = stmt.target
        if t.labels is not None and len(t.labels) != len(wshape):
            raise BinderError(f"GRAD's result has the shape of {wrt_ref.name}, {wshape}: "
                              f"{len(wshape)} label(s), not {len(t.labels)}", statement=script,
                              span=t.span)
        if t.labels is not None and len({l.name for l in t.labels}) != len(t.labels):
            raise BinderError("a label appears twice on the left", statement=script, span=t.span)
        result_dtype = wdtype if np.dtype(wdtype).kind == "f" else "float64"
        for k, step in enumerate(self.steps):  # join an earlier GRAD of the same loss
            if isinstance(step, GradStep) and step.loss == loss and self._same_at(wrt, k):
                self.steps[k] = GradStep(loss, step.wrt + ((wrt, gname, store),),
                                         step.sources + ((script, call.span),))
                break
        else:
            self.steps.append(GradStep(loss, ((wrt, gname, store),), ((script, call.span),)))
        self.known[gname] = (wshape, result_dtype)
        self.current[t.name.lower()] = gname
        if store:
            self.outputs.append(t.name)

    def _warn_unused(self, script: str, loss_ref, wrt_ref, loss: str, wrt: str) -> None:
        """A GradientWarning when ``loss`` does not depend on ``wrt`` as it is now (its
        gradient is zeros): the steps are walked back from the loss's, each name read taken to
        be what the last step before made of it (else the stored tensor)."""
        def made(st) -> list:
            return [into for _, into, _ in st.wrt] if isinstance(st, GradStep) else [st.into]

        def reads(st) -> set:
            if isinstance(st, GradStep):
                return {st.loss} | {t for t, _, _ in st.wrt}
            return {n for n, _ in st.inputs}
        at = max((k for k, st in enumerate(self.steps) if loss in made(st)), default=-1)
        maker = max((k for k, st in enumerate(self.steps) if wrt in made(st)), default=None)
        need, reached = {loss}, False
        for k in range(at, -1, -1):
            outs = need & set(made(self.steps[k]))
            if outs:
                reached |= k == maker and wrt in outs
                need = (need - outs) | reads(self.steps[k])
        if maker is None:
            reached = wrt in need or any(isinstance(n, (BoxName, GatherName)) and wrt in
                                         (n.base, getattr(n, "index", None)) for n in need)
        if reached:
            return
        name = wrt_ref.name
        later = maker is not None and maker > at
        why = (f"'{name}' was assigned after '{loss_ref.name}' was computed, and GRAD is with "
               f"respect to the new {name}" if later else
               f"'{loss_ref.name}' does not read '{name}'")
        warnings.warn(GradientWarning(warning_text(
            f"GRAD({loss_ref.name}, {name}) is zeros: {why}", script, wrt_ref.span,
            hint=f"compute {loss_ref.name} after {name}'s last assignment, or store the gradient "
                 f"before it (dW = GRAD(L, W) above the update)" if later else
            f"GRAD of a tensor the loss uses; {loss_ref.name} is computed from: "
            f"{', '.join(sorted(str(n) for n in need)[:8]) or 'constants'}")), stacklevel=2)

    def _same_at(self, name, k: int) -> bool:
        """Whether ``name`` (a tensor as the group knows it now) was already that tensor when
        step ``k`` ran, so that a GRAD may join step ``k``'s backward pass: stored or made by
        a step before ``k``, and not made by ``k`` or a later step (a stored W reassigned after
        the pass, whose last value keeps the plain name, is another tensor there)."""
        def makes(step) -> bool:
            if isinstance(step, GradStep):
                return any(into == name for _, into, _ in step.wrt)
            return isinstance(step, BoundStep) and step.into == name
        if any(makes(s) for s in self.steps[k:]):
            return False
        return name in self.stored or any(makes(s) for s in self.steps[:k])

    def _add_let(self, script: str, stmt: A.AssignStmt) -> None:
        t = stmt.target
        key = t.name.lower()
        if self.store.has(t.name) or key in self.current and key not in self.let_reads:
            raise CatalogError(f"a tensor named '{t.name}' exists; a LET needs a name of its own",
                               statement=script, span=t.name_span)
        if key in self.let_reads:  # redefined after it was used: later uses inline the new one
            del self.let_reads[key]
            self.current.pop(key, None)
        # Check it now (errors belong to the LET), without adding its steps: it is inlined
        # where it is used, or nowhere.
        probe = GroupBinder(self.store, self.lets, known=dict(self.known), current=dict(self.current))
        if _is_grad(stmt):
            probe.steps, probe.stored = list(self.steps), dict(self.stored)
            probe._add_grad(script, stmt, t.name, store=False, warn=False)
            self.lets[key] = LetDef(script, stmt, *probe.known[t.name])
            self.stale(key)  # LETs that read it see the new definition from here on
            return
        low = lower(script, stmt, probe._resolver(script), t.name, store=False)
        self.lets[key] = LetDef(script, stmt, low.shape, low.dtype)
        self.stale(key)  # LETs that read it see the new definition from here on


def _is_grad(stmt: A.AssignStmt) -> bool:
    return isinstance(stmt.expr, A.Call) and stmt.expr.fn == "grad"
