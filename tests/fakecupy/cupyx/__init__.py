"""A fake ``cupyx`` for a subprocess whose ``cupy`` is tests/fakecupy/cupy: only
``cupyx.scipy.sparse``, the stand-in's own (tests/fakecupy/cupy/_sparse.py)."""
