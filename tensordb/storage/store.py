"""Placeholder: the storage issue replaces this module with the real store."""


class Store:  # pragma: no cover - replaced by the storage work
    def __init__(self, path=None, *, read_only=False):
        raise NotImplementedError("storage is not built yet")


TensorMeta = TensorReader = TensorWriter = None
