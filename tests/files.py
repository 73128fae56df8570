"""What a test sees in a database's ``tiles/`` directory."""
from __future__ import annotations

import os

from tensordb.storage import memfiles


def payload_files(store) -> list[str]:
    """The payload files in ``store``'s ``tiles/``, sorted, less the retired ones it keeps as
    spares for reuse (storage/spares.py), and the payloads an in-memory database keeps as
    bytes (storage/memfiles.py): what the catalog should reference, no more."""
    spares = {os.path.basename(p) for p in store.spares._files}
    kept = [os.path.basename(p) for p in memfiles.paths_under(store.tiles_dir)]
    return sorted([f for f in os.listdir(store.tiles_dir) if f not in spares] + kept)
