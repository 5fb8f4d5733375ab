"""How many bytes a value takes in generated code: at static shapes, its size; in a library compiled
for a shape class (:mod:`.shape_class`), a slot planned at the largest size its dims may take in the
class, and data moved at its size for the dims of the run."""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from cuvil.codegen.dims import DimValues
from cuvil.codegen.llvm_types import I64
from cuvil.codegen.plan import nbytes
from cuvil.codegen.scalar import Builder, Val
from cuvil.codegen.shape_class import ShapeClass
from cuvil.errors import CodegenError
from cuvil.ir.symbolic import Dim, dim_range
from cuvil.ir.types import TensorType, check_tensor_size


@dataclass(frozen=True)
class Sizing:
    """Static shapes (``shape_class`` None) or one shape class."""

    shape_class: ShapeClass | None = None

    @property
    def symbols(self) -> tuple[str, ...] | None:
        """The dims a kernel takes (its trailing ``ptr dims`` argument), or None at static shapes."""
        return self.shape_class.symbols if self.shape_class is not None else None

    def planned(self, t: TensorType) -> int:
        """The bytes of ``t``'s slot: its size, or each dim's upper bound over the class (a formula that
        falls as a symbol grows, ``10 - N``, is sized for its smallest symbol)."""
        sc = self.shape_class
        if sc is None:
            return nbytes(t)
        ranges = {s: sc.bound(s)[:2] for s in sc.symbols}
        dims = []
        for d in t.shape:
            _, hi = dim_range(d, ranges)
            if hi is None:
                raise CodegenError(f"the dim {d} of a value of type {t} has no upper bound in the shape class",
                                   location=str(t), hint="compile at concrete shapes (--specialize NAME=2x3x...)")
            dims.append(max(hi, 0))
        check_tensor_size(dims, f"a value of type {t} at the largest dims", str(t))
        n = t.dtype.np.itemsize
        for d in dims:
            n *= d
        return n

    def runtime(self, b: Builder, dims: DimValues | None, t: TensorType) -> Val:
        """The bytes of ``t`` for the dims of this run, as an ``i64``."""
        if dims is None or t.is_static:
            return ir.Constant(I64, nbytes(t))
        return numel(b, dims, t.shape, t.dtype.np.itemsize)


STATIC = Sizing()


def numel(b: Builder, dims: DimValues, shape: tuple[Dim, ...], itemsize: int = 1) -> Val:
    """``itemsize`` times the product of ``shape``'s dims, at run time."""
    size: Val = ir.Constant(I64, itemsize)
    for d in shape:
        size = b.mul(size, dims.value(d))
    return size
