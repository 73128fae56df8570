"""The driver: one pipeline for every statement group, Graph and EXPLAIN (pipeline.py), one
catalog snapshot per group (snapshot.py), one prepared-statement cache (cache.py), the sinks
a run's outputs go to (sink.py), and the per-connection state it runs with (engine.py)."""
from .cache import PreparedCache
from .engine import Engine
from .pipeline import Prepared, Target, parse, prepare
from .sink import ArraySink, StoreSink
from .snapshot import Snapshot

__all__ = ["Engine", "Prepared", "PreparedCache", "Snapshot", "Target", "ArraySink", "StoreSink",
           "parse", "prepare"]
