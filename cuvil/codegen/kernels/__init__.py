"""Tuned kernels: schedules of an op's own compute rule for the ops that dominate run time.

:func:`select_kernel` looks at one op of the lowered function (a ``matmul`` or ``conv``, or a
``fused`` epilogue whose body is one of them followed by elementwise ops) and returns a kernel
that computes exactly what the rule says, with blocking, packing, vectorization and threads;
anything it does not recognize returns None and is lowered from its rule by the generic loop
nests. Each kernel is differential-tested against the interpreter (tests/codegen/test_kernels.py).

A kernel emits ``i32 name(ptr out, ptr in0, ..., ptr scratch)``; ``unused_operands`` are
operand positions whose raw values it never reads (constants it packed), ``scratch_bytes`` the private
working memory it needs in the context, ``constant_bytes`` what it embeds (packed weights, tables).
A kernel may take data of its own in an unused operand's slot, :func:`operand_data` (the GEMM's
packed weights: its code is then the same for every weight of one shape, and repeated layers share
it); every caller passes that data there.

A function with symbolic dims compiled once for its shape class (:mod:`cuvil.codegen.dims`) asks
:func:`select_symbolic_kernel` instead: for a float32 ``matmul`` (or matmul epilogue) whose M, N,
K and batch dims may be symbolic (a linear layer over symbolic leading dims, run as one GEMM of
their product rows; attention's ``Q @ K^T`` and ``P @ V`` over symbolic batch and sequence), the
same tuned GEMM with those sizes read at run time. That kernel takes one more argument, ``i32
name(ptr out, ptr in0, ..., ptr scratch, ptr dims)`` (the ``i64`` values of the function's symbols,
in the order given), decides the number of blocks and whether to use the pool at run time, does
nothing when the output is empty and stores the epilogue of a zero sum when K is 0.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np

from cuvil.codegen.kernels.base import Kernel, operand_args, operand_data
from cuvil.codegen.kernels.chunked import chunked_rule_kernel
from cuvil.codegen.kernels.conv_transpose import conv_transpose_kernel
from cuvil.codegen.kernels.copy import copy_kernel
from cuvil.codegen.kernels.epilogue import Contraction, contraction_of
from cuvil.codegen.kernels.extremum import extremum_kernel
from cuvil.codegen.kernels.gemm import (
    MatmulKernel,
    RunTimeDims,
    agrees_at_every_size,
    force_isa,
    host_isa,
    rows_view,
)
from cuvil.codegen.kernels.paired import paired_conv_kernel, paired_matmul_kernel
from cuvil.codegen.kernels.pool import avg_pool_kernel, max_pool_kernel
from cuvil.codegen.kernels.rows import row_kernel, sum_rows_kernel
from cuvil.codegen.kernels.transpose import transpose_kernel
from cuvil.codegen.kernels.vnni import vnni_conv, vnni_matmul
from cuvil.codegen.kernels.widen import HALVES, widened, widened_contraction, widened_types
from cuvil.codegen.shape_class import ShapeClass
from cuvil.ir.dtypes import DType
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value

_enabled = os.environ.get("CUVIL_KERNELS", "1") not in ("0", "off", "no")
"""``CUVIL_KERNELS=0`` turns the tuned kernels off for a whole process (like :func:`generic_only`)."""


@contextlib.contextmanager
def generic_only() -> Iterator[None]:
    """Lower every op from its rule (no tuned kernels) inside the block: the baseline kernels are
    compared with. The artifact cache does not know about this switch: compile with ``cache=False``."""
    global _enabled
    saved = _enabled
    _enabled = False
    try:
        yield
    finally:
        _enabled = saved


def _const_array(v: Value, constants: Mapping[str, np.ndarray]) -> np.ndarray | None:
    if not v.is_const:
        return None
    return constants.get(v.const_hash)


def _matmul_kernel(v: Value, c: Contraction, in_types: Sequence[TensorType], out_type: TensorType,
                   rhs: np.ndarray | None) -> Kernel | None:
    return MatmulKernel(v.op, c, in_types, out_type, rhs, host_isa())


def _conv_kernel(v: Value, c: Contraction, in_types: Sequence[TensorType], out_type: TensorType,
                 rhs: np.ndarray | None) -> Kernel | None:
    from cuvil.codegen.kernels.conv import select_conv

    return select_conv(v.op, c, in_types, out_type, rhs, host_isa())


KernelFactory = Callable[[Value, Contraction, Sequence[TensorType], TensorType, np.ndarray | None], Kernel | None]

KERNELS: dict[str, tuple[str, KernelFactory]] = {
    "matmul": ("tuned GEMM", _matmul_kernel),
    "conv": ("tuned GEMM convolution (constant weights, 1-3 spatial dims)", _conv_kernel),
}
"""The tuned kernel of each contraction that has one: what it is, and how to make it for a value
(given its contraction, operand types and constant right operand). Only float32 at static shapes
(:func:`select_symbolic_kernel` gives the matmul's at symbolic ones)."""


def tuned_kernels() -> dict[str, str]:
    """Which ops a tuned kernel may compute (the LLVM column of ``cuvil ops``), and with what."""
    out = {op: f"{text}, float32 (float16, bfloat16: widened into it)" for op, (text, _) in KERNELS.items()}
    for op in KERNELS:
        out[op] += "; int32 over constant int8-valued weights: VNNI int8 dot products"
    out["fused"] = "tuned kernels for " + " / ".join(KERNELS) + " epilogues, float32 (int32 matmul: VNNI; " \
                   "bf16_matmul, bf16_conv: bfloat16 pairs)"
    for op in ("softmax", "log_softmax", "layer_norm"):
        out[op] = "rows advancing sixteen at a time (vectorized), float32"
    for op in ("max_pool", "avg_pool"):
        out[op] = "2-D windows along each row (vectorized, masked at the edges), float32"
    for op in ("reduce_min", "reduce_max"):
        out[op] = "a whole tensor in vectors (a zero result's sign from the last zero), float32"
    out["conv_transpose"] = "2-D, one output row per chunk, each column phase's reached taps fixed (vectorized), " \
                            "float32"
    out["transpose"] = "16x16 blocks turned in registers where the last axis moves, float32"
    out["bf16_matmul"] = "tuned GEMM over bfloat16 pairs with its fused epilogue (vdpbf16ps; AVX512-BF16, constant " \
                         "right operand, even K)"
    out["bf16_conv"] = "tuned convolution over bfloat16 channel pairs with its fused epilogue (vdpbf16ps; " \
                       "AVX512-BF16, constant weights, 1-3 spatial dims)"
    return out


def select_kernel(v: Value, constants: Mapping[str, np.ndarray]) -> Kernel | None:
    """A tuned kernel for ``v`` (static shapes), or None to use the generic rule lowering."""
    if not _enabled or v.is_param or v.is_const:
        return None
    c = contraction_of(v)
    if c is None:
        return None
    if c.op == "bf16_matmul":
        return paired_matmul_kernel(v, c, constants)
    if c.op == "bf16_conv":
        return paired_conv_kernel(v, c, constants)
    types = [c.lhs_type, c.rhs_type, c.out_type]
    if any(not t.is_static for t in types) or not v.type.is_static or any(not o.type.is_static for o in v.operands):
        return None
    if any(int(d) == 0 for t in types for d in t.shape):
        return None
    entry = KERNELS.get(c.op)
    if entry is None:
        return None
    rhs = _const_array(v.operands[c.rhs], constants)
    if all(t.dtype is DType.f32 for t in types):
        return entry[1](v, c, [o.type for o in v.operands], v.type, rhs)
    if all(t.dtype is DType.i32 for t in types):  # quantize-int8's products: int8 dot products (VNNI)
        make = vnni_matmul if c.op == "matmul" else vnni_conv
        return make(v.op, c, [o.type for o in v.operands], v.type, rhs)
    every = [*types, *(o.type for o in v.operands), v.type]
    if all(t.dtype in (*HALVES, DType.f32) for t in every) and any(t.dtype in HALVES for t in every):
        return _widened(v, c, entry[1], rhs)  # float16 / bfloat16: the float32 kernel on widened buffers
    return None


def _widened(v: Value, c: Contraction, make: KernelFactory, rhs: np.ndarray | None) -> Kernel | None:
    wide = widened_contraction(c)
    if wide is None:
        return None
    in_types, out_type = [o.type for o in v.operands], v.type
    wide_in, wide_out = widened_types(in_types, out_type)
    if rhs is not None and not (c.op == "matmul" and rhs.dtype == np.float16):  # a GEMM keeps float16 panels
        rhs = rhs.astype(np.float32)
    return widened(make(v, wide, wide_in, wide_out, rhs), in_types, out_type)


def _widened_rows(v: Value) -> Kernel | None:
    """A float16 / bfloat16 softmax, log_softmax or layer norm: its rule widens every operand, computes in
    float32 and rounds once, which is the float32 row kernel between a widening and a rounding."""
    kernel = row_kernel(v, halves=True)
    if kernel is None or not any(t.dtype in HALVES for t in (v.type, *(o.type for o in v.operands))):
        return None
    return widened(kernel, [o.type for o in v.operands], v.type)


def select_symbolic_kernel(v: Value, constants: Mapping[str, np.ndarray], symbols: tuple[str, ...],
                           maxima: Mapping[str, int]) -> Kernel | None:
    """A tuned kernel for ``v`` in a function compiled for a shape class (dims read at run time from
    the kernel's last argument, ``symbols``' values in that order; each at most its ``maxima``), or
    None to use the generic rule lowering over symbolic extents.

    Only a float32 matmul (or matmul epilogue) has one, with any of M, N, K and the batch dims
    symbolic, transposed operands or not (:class:`cuvil.codegen.kernels.gemm.MatmulKernel`). A 2-D
    rhs (a constant one is packed at compile time) under symbolic leading lhs dims runs as one GEMM
    of their product rows where :func:`cuvil.codegen.kernels.gemm.rows_view` allows; otherwise each
    batch entry is a problem. Declined: sizes that are equal only at run time, batch dims that would
    broadcast only at some sizes (:func:`cuvil.codegen.kernels.gemm.agrees_at_every_size`), and a
    static dim of 0. The kernel needs no scratch."""
    if not _enabled or v.is_param or v.is_const:
        return None
    c = contraction_of(v)
    if c is None or c.op != "matmul":
        return None
    types = [c.lhs_type, c.rhs_type, c.out_type]
    if any(t.dtype is not DType.f32 for t in types):
        return None
    if any(isinstance(d, int) and d == 0 for t in types for d in t.shape):
        return None
    operand_types = [o.type for o in v.operands]
    known = set(symbols) & set(maxima)  # read from the dims, and tiled for their largest values
    if any(not t.symbols() <= known for t in [v.type, *operand_types]):
        return None
    if not agrees_at_every_size(c):
        return None
    rhs = _const_array(v.operands[c.rhs], constants)
    runtime = RunTimeDims(tuple(symbols), dict(maxima))
    view = rows_view(c, operand_types, v.type) if c.rhs_type.rank == 2 else None
    if view is not None:
        contraction, in_types, out_type, _ = view
        return MatmulKernel(v.op, contraction, in_types, out_type, rhs, host_isa(), runtime)
    return MatmulKernel(v.op, c, operand_types, v.type, rhs, host_isa(), runtime)


def choose_kernel(v: Value, constants: Mapping[str, np.ndarray], shape_class: ShapeClass | None) -> Kernel | None:
    """The tuned kernel of ``v`` in a function at static shapes or compiled for ``shape_class``: a static
    one where ``v``'s types are static, else one taking the dims (:func:`takes_dims`), else None."""
    kernel = select_kernel(v, constants) or (row_kernel(v, shape_class) if _enabled else None) or \
        (_widened_rows(v) if _enabled and shape_class is None else None)
    if kernel is None and shape_class is None and _enabled:
        kernel = max_pool_kernel(v) or avg_pool_kernel(v) or transpose_kernel(v) or conv_transpose_kernel(v) or \
            extremum_kernel(v) or sum_rows_kernel(v)
    if kernel is None and shape_class is not None and _enabled:
        kernel = copy_kernel(v, shape_class.symbols) or \
            select_symbolic_kernel(v, constants, shape_class.symbols, shape_class.maxima)
    if kernel is None and shape_class is None and _enabled:  # the rule nest, in chunks on the pool
        kernel = chunked_rule_kernel(v, constants)
    return kernel


def takes_dims(kernel: Kernel) -> bool:
    """Whether ``kernel`` takes the trailing ``ptr dims`` argument (its sizes are read at run time)."""
    return getattr(kernel, "runtime", None) is not None


__all__ = ["KERNELS", "Kernel", "choose_kernel", "force_isa", "generic_only", "host_isa", "operand_args",
           "operand_data", "select_kernel", "select_symbolic_kernel", "takes_dims", "tuned_kernels"]
