"""What an exported Parquet or CSV file says about its tensor: shape, dimension names, dtype.

A COO table alone loses the shape's trailing zero rows (nothing shows that a last row exists if
it holds only zeros) and the dtype of a CSV. Exports therefore record them:

- Parquet: the file's key-value metadata, key ``tensordb``;
- CSV: a sidecar file ``<file>.tensordb.json`` next to it, which also records the CSV's size in
  bytes, so a sidecar left over from another file is ignored.

Both hold the same JSON object: ``{"shape": [3, 4], "dims": ["i", "j"], "dtype": "float32"}``.
Loading such a file without index= reads it back as that tensor.

>>> import json
>>> info = parse(json.dumps({"shape": [3, 4], "dims": ["i", "j"], "dtype": "float32"}), "x")
>>> info["shape"], info["dims"]
((3, 4), ('i', 'j'))
"""
from __future__ import annotations

import json
import os

import numpy as np

from ..errors import DataError

__all__ = ["KEY", "SIDECAR", "describe", "parse", "read", "sidecar_path", "write_sidecar"]

KEY = "tensordb"
SIDECAR = ".tensordb.json"
_DTYPES = ("bool", "float32", "float64", "int32", "int64")


def describe(meta) -> str:
    """The JSON text recorded for tensor ``meta``."""
    info = {"shape": [int(n) for n in meta.shape], "dims": list(meta.dims),
            "dtype": np.dtype(meta.dtype).name}
    if getattr(meta, "fill", 0):  # the value of the rows left out (as text: JSON has no inf)
        info["fill"] = repr(float(meta.fill))
    return json.dumps(info)


def sidecar_path(path: str) -> str:
    return path + SIDECAR


def write_sidecar(meta, path: str, csv_path: str) -> None:
    """Write the sidecar of ``csv_path`` (already written) to ``path``."""
    info = json.loads(describe(meta))
    info["csv_bytes"] = os.path.getsize(csv_path)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(info, f)
        f.write("\n")


def parse(text: str, where: str) -> dict:
    """Check the recorded JSON: shape (ints >= 0), one dim name per dimension, a dtype."""
    try:
        info = json.loads(text)
        shape = tuple(info["shape"])
        dims = tuple(info["dims"])
        dtype = info.get("dtype")
        fill = float(info.get("fill", 0.0))
        ok = (all(type(n) is int and n >= 0 for n in shape) and len(dims) == len(shape)
              and all(isinstance(d, str) for d in dims) and (dtype is None or dtype in _DTYPES)
              and fill == fill)
    except (ValueError, TypeError, KeyError, AttributeError):
        ok = False
    if not ok:
        raise DataError(f"{where}: its tensordb metadata is not valid: {text[:200]!r}",
                        hint="give index= and shape= (INDEX (...) VALUE ... SHAPE (...)) to read "
                             "it as a plain coordinate table")
    return {"shape": shape, "dims": dims, "dtype": dtype, "csv_bytes": info.get("csv_bytes"),
            "fill": fill}


def read(fmt: str, path: str) -> dict | None:
    """The recorded shape/dims/dtype of a Parquet or CSV file, or None when it has none."""
    if fmt == "parquet":
        import pyarrow.parquet as pq
        try:
            kv = pq.read_metadata(path).metadata or {}
        except (OSError, ValueError):
            return None  # not readable as Parquet: DuckDB's reader will say why
        text = kv.get(KEY.encode())
        return None if text is None else parse(text.decode("utf-8", "replace"), path)
    if fmt == "csv":
        side = sidecar_path(path)
        if not os.path.isfile(side):
            return None
        try:
            with open(side, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise DataError(f"cannot read {side}: {exc}") from None
        info = parse(text, side)
        if info["csv_bytes"] != os.path.getsize(path):
            return None  # the CSV was written again by something else: the sidecar is stale
        return info
    return None
