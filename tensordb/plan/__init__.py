"""From names and einsum specs to the IR: operations, graphs, shape and label checks."""
from .ir import AGGS, SUPPORTED_DTYPES, EinGraph, EinOp, Operand, TensorInfo, check_dtype
from .scalar import Call, Const, Expr, Input, parse_join

__all__ = ["AGGS", "SUPPORTED_DTYPES", "EinGraph", "EinOp", "Operand", "TensorInfo", "check_dtype",
           "Call", "Const", "Expr", "Input", "parse_join"]
