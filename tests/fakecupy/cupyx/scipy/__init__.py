"""A fake ``cupyx.scipy``: only its ``sparse`` (tests/fakecupy/cupy/_sparse.py)."""
