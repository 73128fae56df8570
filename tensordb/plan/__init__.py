"""From names and einsum specs to the IR: operations, graphs, shape and label checks."""
from ..dtypes import SUPPORTED_DTYPES, check_dtype
from .aggregates import AGGREGATES, AGGS, AggregateFn
from .ir import EinGraph, EinOp, Operand, TensorInfo
from .scalar import Call, Const, Expr, Input, parse_join

__all__ = ["AGGREGATES", "AGGS", "AggregateFn", "SUPPORTED_DTYPES", "EinGraph", "EinOp", "Operand", "TensorInfo", "check_dtype",
           "Call", "Const", "Expr", "Input", "parse_join"]
