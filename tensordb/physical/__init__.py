"""Lowering and placement: an EinGraph and its Decomposition become a TilePlan of tile joins and
aggregations, every task of it gets the worker that runs it, and aggregations wider than the
executor combines become trees. Plans are kept by the driver's cache while their inputs keep their
layout (tensordb/driver/cache.py)."""
from .lower import describe, lower
from .order import order
from .placement import place, transfers, worker_flops
from .sink import CatalogSink, OutputWriters
from .plan import Aggregate, Assemble, Kernel, Load, OpStats, OutputTiles, TilePlan, describe_tasks
from .trees import aggregation_trees

__all__ = ["lower", "place", "aggregation_trees", "order", "transfers", "worker_flops",
           "CatalogSink", "OutputWriters", "describe", "TilePlan", "Load", "Assemble", "Kernel",
           "Aggregate", "OutputTiles", "OpStats", "describe_tasks"]
