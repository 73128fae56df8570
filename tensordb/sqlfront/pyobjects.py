"""Python objects shown to SQL, as DuckDB's Python API shows them: registered by name
(``con.register``) or found by the name a query gives them (DuckDB's replacement scan).

DuckDB's replacement scan looks a missing table's name up in the locals, then the globals, of the
Python frame that called it. Every query tensordb runs is called from tensordb's own frames, so
that lookup would see tensordb's locals, never the user's. ``scanning`` does the lookup itself:
it walks out of tensordb's frames to the first frame that is not tensordb's (the user's code, a
notebook cell), takes the names the statement spells (DuckDB's tokenizer: a name inside a string
or a comment is none), and registers those that name a data frame, an Arrow table or a polars
frame there, and are not a tensor, a table, a view or a registered object, for the statement only.

>>> import pyarrow as pa
>>> from tensordb.storage import Store
>>> from tensordb.sqlfront.relations import sql
>>> prices = pa.table({"p": [1.5, 2.5]})
>>> with Store() as store:
...     sql(store, "SELECT sum(p) FROM prices").fetchall()
[(4.0,)]
"""
from __future__ import annotations

import contextlib
import os
import re
import sys

import duckdb

from ..errors import CatalogError, ProgrammingError
from ..storage import spelled_names, translating

__all__ = ["is_scannable", "is_xarray", "register", "unregister", "scanning", "scans_for", "user_frame",
           "sql_type", "missing_object"]

# (module prefix, class name) of the objects DuckDB scans; looked up by name, so that pandas and
# polars are imported only when the user has them.
_SCANNABLE = {
    ("pandas", "DataFrame"), ("pyarrow", "Table"), ("pyarrow", "RecordBatch"),
    ("pyarrow", "RecordBatchReader"), ("pyarrow", "Dataset"), ("pyarrow", "FileSystemDataset"),
    ("pyarrow", "Scanner"), ("polars", "DataFrame"), ("polars", "LazyFrame"),
    ("duckdb", "DuckDBPyRelation"),
}


def is_scannable(obj) -> bool:
    """Whether DuckDB can scan ``obj`` as a table (a pandas/polars frame, an Arrow table, batch,
    reader or dataset, a relation)."""
    if _is_relation(obj):
        return True
    for cls in type(obj).__mro__:
        root = (cls.__module__ or "").split(".")[0].lstrip("_")
        if (root, cls.__name__) in _SCANNABLE:
            return True
    return False


def is_xarray(obj) -> bool:
    """Whether ``obj`` is an xarray DataArray (xarray is not imported)."""
    return any(cls.__name__ == "DataArray" and (cls.__module__ or "").startswith("xarray")
               for cls in type(obj).__mro__)


def _is_relation(obj) -> bool:
    """A tensordb relation (relations.py, which imports this module)."""
    return type(obj).__name__ == "Relation" and type(obj).__module__ == "tensordb.sqlfront.relations"


def _unwrapped(obj):
    return obj.relation if _is_relation(obj) else obj


def sql_type(name: str | None):
    """DuckDB's type object for a type name (what its cursors put in ``description``: equal to
    the name and to duckdb's DB-API type groups); None stays None."""
    if name is None:
        return None
    try:
        return duckdb.sqltype(str(name))
    except duckdb.Error:
        return str(name)


# -- registered objects ----------------------------------------------------------------------------

def register(store, name: str, obj) -> None:
    """Show ``obj`` to later SQL as the view ``name`` (``con.register``), replacing an object
    registered under that name before; a tensor's name is refused (tensors, tables and
    registered objects share one namespace)."""
    store.check_open()
    if not isinstance(name, str) or not name:
        raise ProgrammingError(f"a view name must be a non-empty string, got {name!r}")
    if not is_scannable(obj):
        raise ProgrammingError(
            f"cannot register {type(obj).__name__} as '{name}': DuckDB scans pandas and polars "
            "DataFrames, Arrow tables, batches, readers and datasets, and relations",
            hint="load arrays as tensors with con.load(name, array)")
    if store.has(name):
        raise CatalogError(f"cannot register '{name}': a tensor named '{store.meta(name).name}' "
                           "exists", hint="tensors, tables and registered objects share one "
                                          "namespace; choose another name")
    with store.lock:
        _drop_registered(store, name)
        with translating(f"cannot register '{name}'"):
            store.duck.register(name, _unwrapped(obj))
        store.registered[name] = _unwrapped(obj)


def unregister(store, name: str) -> None:
    """Forget the object registered as ``name`` (DuckDB's ``unregister``: nothing happens when
    there is none)."""
    store.check_open()
    with store.lock:
        _drop_registered(store, name)


def _drop_registered(store, name: str) -> None:
    for known in [k for k in store.registered if k.lower() == str(name).lower()]:
        del store.registered[known]
        with contextlib.suppress(duckdb.Error):
            store.duck.unregister(known)


# -- the replacement scan --------------------------------------------------------------------------

# The package's directory: a frame running a file under it is tensordb's (a doctest's frame,
# whose globals are a module's, is the user's).
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _ours(frame) -> bool:
    path = frame.f_code.co_filename
    return path.startswith(_PACKAGE) or \
        (not os.path.isabs(path) and os.path.abspath(path).startswith(_PACKAGE))


def user_frame():
    """The innermost frame that is not tensordb's: the code that called tensordb."""
    frame = sys._getframe(1)
    while frame is not None and _ours(frame):
        frame = frame.f_back
    return frame


def _spelled_names(query: str) -> list[str]:
    """Identifiers and keywords of ``query`` as spelled; none for text DuckDB cannot even
    tokenize (running it says why)."""
    try:
        return spelled_names(query)
    except Exception:
        return []


def scans_for(store, query: str, frame=None) -> dict:
    """The objects of the user's frame that ``query`` names and that no tensor, table, view or
    registered object of that name hides: {name: object}."""
    frame = user_frame() if frame is None else frame
    if frame is None:
        return {}
    found = {}
    for word in _spelled_names(query):
        obj = frame.f_locals.get(word, frame.f_globals.get(word))
        if obj is not None and word not in found and is_scannable(obj):
            found[word] = obj
    if not found:
        return {}
    taken = {k.lower() for k in store.registered}
    with store.lock, translating():
        taken.update(r[0] for r in store.duck.execute(
            "SELECT lower(table_name) FROM duckdb_tables() WHERE list_contains(?, lower(table_name)) "
            "UNION ALL SELECT lower(view_name) FROM duckdb_views() WHERE NOT internal AND "
            "list_contains(?, lower(view_name))",
            [[k.lower() for k in found]] * 2).fetchall())
    return {k: v for k, v in found.items() if k.lower() not in taken and not store.has(k)}


@contextlib.contextmanager
def scanning(store, scans: dict):
    """Register ``scans`` ({name: object}) for the block; afterwards each name is what it was
    (nothing, or the tensor's view). The block gets a function ``more(name, obj)`` that
    registers one more (added to ``scans``) until the block ends; the caller holds the store's
    lock then."""
    with store.lock if scans else contextlib.nullcontext():
        done = []

        def more(name, obj):
            with translating(f"cannot scan '{name}'"):
                store.duck.register(name, _unwrapped(obj))
            store.scanning[name] = _unwrapped(obj)
            scans[name] = obj
            done.append(name)

        try:
            for name, obj in list(scans.items()):
                more(name, obj)
            yield more
        finally:
            for name in done:
                store.scanning.pop(name, None)
                with contextlib.suppress(duckdb.Error):
                    store.duck.unregister(name)
                _restore(store, name)


_MISSING = re.compile(r'Table with name "?([^"\s!]+)"? does not exist')


def missing_object(store, exc, scans: dict) -> tuple[str, object] | None:
    """(name, object) when ``exc`` is DuckDB saying a table is missing that the user's frame
    holds as a data frame (a view over it names it, not the statement): scanned then, as
    DuckDB's replacement scan finds it when it binds. None otherwise."""
    found = _MISSING.search(getattr(exc, "message", "") or str(exc))
    if found is None or found.group(1) in scans:
        return None
    name, frame = found.group(1), user_frame()
    if frame is None:
        return None
    obj = frame.f_locals.get(name, frame.f_globals.get(name))
    if obj is None or not is_scannable(obj) or store.has(name) or \
            any(k.lower() == name.lower() for k in store.registered):
        return None
    return name, obj


def _restore(store, name: str) -> None:
    """What ``name`` showed before a statement's scan took it: a registered object, a tensor."""
    for known, obj in store.registered.items():
        if known.lower() == name.lower():
            with contextlib.suppress(duckdb.Error):
                store.duck.register(known, obj)
            return
    views = store.views_of(name)
    if views and store.has(name):
        from ..storage.views import TensorStream
        for view in views:
            store.register_view(view, TensorStream(store.open(name)))
