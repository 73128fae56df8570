"""Lowering: an EinGraph and its Decomposition become a TilePlan of tile joins and aggregations."""
from .lower import OutputWriters, describe, lower
from .plan import Aggregate, Assemble, Kernel, Load, OpStats, OutputTiles, TilePlan

__all__ = ["lower", "OutputWriters", "describe", "TilePlan", "Load", "Assemble", "Kernel",
           "Aggregate", "OutputTiles", "OpStats"]
