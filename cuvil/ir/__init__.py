"""CIR: Cuvil's SSA IR. Types, values, op definitions, modules and the text format."""

from cuvil.ir import ops  # noqa: F401  (registers every op family)
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Function, Module
from cuvil.ir.opdef import OpDef, all_ops, define, get_op
from cuvil.ir.symbolic import Dim, Sym, sym
from cuvil.ir.types import DimConstraint, TensorType
from cuvil.ir.values import Value

__all__ = ["Builder", "DType", "Dim", "DimConstraint", "Function", "Module", "OpDef", "Sym", "TensorType",
           "Value", "all_ops", "define", "get_op", "sym"]
