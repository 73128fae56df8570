"""Names of the tensors in a graph: one scheme for versions, temporaries and pairwise steps.

A statement's result may be computed under a name of its own: an earlier version of a name
reassigned in the same group (``P.v1``), a temporary (a nested aggregate or a part of a long
chain: ``P.t1``), a pairwise step of a split product (``D.1``), or an internal name because the
graph also reads the tensor it replaces (``A'``). A ``TensorRef`` carries those parts as fields;
its text is only how it prints (EXPLAIN, errors) and keys dictionaries, and no stage parses it.

>>> r = TensorRef("P", version=1).temporary(2).pairwise(1)
>>> str(r), r.name, r.version, r.temp, r.step
('P.v1.t2.1', 'P', 1, 2, 1)
>>> TensorRef("A").internal_copy().name
'A'
"""
from __future__ import annotations

__all__ = ["TensorRef"]

_FIELDS = ("name", "version", "temp", "step", "internal")


class TensorRef(str):
    """A tensor's name in a graph: a ``str`` (its text) that carries its parts.

    ``name`` is the user-visible tensor (the catalog name a stored result is stored under),
    ``version`` > 0 an earlier version of it in a group, ``temp`` > 0 a temporary of the statement,
    ``step`` > 0 a pairwise step of a split product, ``internal`` a result computed under another
    name because the graph reads the tensor it replaces.
    """

    name: str
    version: int
    temp: int
    step: int
    internal: bool

    def __new__(cls, name: str, version: int = 0, temp: int = 0, step: int = 0,
                internal: bool = False) -> "TensorRef":
        name = str(name)
        text = name + ("'" if internal else "") + (f".v{version}" if version else "") + \
            (f".t{temp}" if temp else "") + (f".{step}" if step else "")
        self = super().__new__(cls, text)
        for k, v in zip(_FIELDS, (name, int(version), int(temp), int(step), bool(internal))):
            object.__setattr__(self, k, v)
        return self

    @classmethod
    def of(cls, name: str) -> "TensorRef":
        """``name`` itself if it is a TensorRef, else a plain name (no version, temporary...)."""
        return name if isinstance(name, TensorRef) else cls(name)

    def __setattr__(self, key, value):
        raise AttributeError("a TensorRef is immutable")

    def __reduce__(self):
        return TensorRef, tuple(getattr(self, k) for k in _FIELDS)

    # repr is str's: a TensorRef shows as the name it prints as, in reprs of steps and plans too.

    def _with(self, **parts) -> "TensorRef":
        now = {k: getattr(self, k) for k in _FIELDS}
        return TensorRef(**{**now, **parts})

    # -- the names derived from a name ---------------------------------------------------------
    def temporary(self, n: int) -> "TensorRef":
        """The n-th temporary of the statement computing this name."""
        return self._with(temp=n)

    def pairwise(self, n: int) -> "TensorRef":
        """The n-th pairwise step of a product split from the operation computing this name."""
        return self._with(step=n)

    def internal_copy(self) -> "TensorRef":
        """This name computed under an internal name (the graph also reads the stored one)."""
        return self._with(internal=True)

    @property
    def is_result(self) -> bool:
        """The statement's result itself: no earlier version, temporary or pairwise step."""
        return not (self.version or self.temp or self.step)

    def within(self, key: str) -> bool:
        """Whether this tensor is computed under ``key``: its statement's result, an earlier
        version, temporary or pairwise step of it (pieces fixed for ``key`` apply to it).
        ``key`` names a result (``P``, ``P.v1``, or a graph's own name); the internal rename
        does not count (fixed pieces name the tensor the user sees)."""
        if str(self) == key:
            return True
        k = TensorRef.of(key)
        if k.name != self.name or k.temp or k.step:
            return False
        return not k.version or k.version == self.version
