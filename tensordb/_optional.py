"""Optional packages (pandas, polars, xarray, zarr): imported when a method needs them, and a
tensordb error that names the extra to install when they are missing.

>>> require("numpy", "fetchnumpy()").__name__
'numpy'
"""
from __future__ import annotations

import importlib

from .errors import InterfaceError

__all__ = ["require", "EXTRAS"]

EXTRAS = {"pandas": "pandas", "polars": "polars", "xarray": "xarray", "zarr": "zarr",
          "sparse": "sparse"}


def require(module: str, feature: str):
    """The module, or an InterfaceError naming ``pip install tensordb[extra]``."""
    try:
        return importlib.import_module(module)
    except ImportError:
        extra = EXTRAS.get(module, module)
        raise InterfaceError(f"{feature} needs {module}, which is not installed",
                             hint=f"pip install tensordb[{extra}]") from None
