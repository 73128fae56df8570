"""Lowering: an EinGraph and its Decomposition become a TilePlan of tile joins and aggregations."""
from .lower import OutputWriters, describe, lower, store_outputs
from .plan import Aggregate, Assemble, Kernel, Load, OpStats, OutputTiles, TilePlan

__all__ = ["lower", "store_outputs", "OutputWriters", "describe", "TilePlan", "Load", "Assemble", "Kernel",
           "Aggregate", "OutputTiles", "OpStats"]
