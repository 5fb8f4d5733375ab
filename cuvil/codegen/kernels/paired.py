"""``bf16_matmul`` on the float32 GEMM's blocking, two bfloat16 to each 32-bit element (``vdpbf16ps``).

The op's rule is a ``dot_ftz`` along K in pairs, each pair's odd term first (:mod:`cuvil.ir.ops.linalg`):
what one ``vdpbf16ps`` step computes in a lane whose 32-bit words of A and B hold the pair, the even term
in the low half. A row of a row-major bfloat16 A is such a sequence of words as it lies in memory; a
constant B is packed at compile time into the words ``b[2j, n] | b[2j + 1, n] << 16``. The float32 GEMM
kernel over the words (K / 2 steps, every step one instruction per accumulator, from -0.0), written under
:func:`~cuvil.codegen.kernels.gemm.bf16_pairs`, therefore computes the rule bit for bit: it only moves
the words, never does arithmetic on them, so no bit of a pair changes on the way. An odd K, a transposed
A, a B that is not constant, and a target without AVX512-BF16 use the generic lowering of the rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from cuvil.codegen.kernels.base import Kernel, RunsInner
from cuvil.codegen.kernels.epilogue import Contraction
from cuvil.codegen.kernels.gemm import ISAS, MatmulKernel, bf16_pairs, host_isa
from cuvil.codegen.target import codegen_target
from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value


@dataclass(frozen=True)
class PairedKernel(RunsInner):
    """The float32 GEMM ``inner`` over bfloat16 pairs: emitted under :func:`bf16_pairs`."""

    inner: Kernel

    @property
    def name(self) -> str:
        return f"{self.inner.name}.bf16x2"

    def emit(self, mod: ir.Module, name: str) -> ir.Function:
        with bf16_pairs():
            return self.inner.emit(mod, name)


def pair_words(b: np.ndarray) -> np.ndarray:
    """A bfloat16 ``[K, N]`` matrix (K even) as ``[K / 2, N]`` words ``b[2j, n] | b[2j + 1, n] << 16``, read
    as float32 (the bits kept; the kernel never computes with them)."""
    k, n = b.shape
    bits = np.ascontiguousarray(b).view(np.uint16).astype(np.uint32).reshape(k // 2, 2, n)
    return np.ascontiguousarray(bits[:, 0] | (bits[:, 1] << 16)).view(np.float32)


def paired_matmul_kernel(v: Value, constants: Mapping[str, np.ndarray]) -> Kernel | None:
    """The paired kernel of a ``bf16_matmul`` with a constant 2-D right operand, or None."""
    if v.op != "bf16_matmul" or not codegen_target().has("avx512bf16") or host_isa() is not ISAS["avx512"]:
        return None
    lhs, rhs = v.operands
    b = constants.get(rhs.const_hash) if rhs.is_const else None
    if b is None or not (lhs.type.is_static and rhs.type.is_static and v.type.is_static):
        return None
    if v.attr("transpose_a") or rhs.type.rank != 2:
        return None
    k = int(lhs.type.shape[-1])
    if k % 2 or k == 0 or any(int(d) == 0 for d in v.type.shape):
        return None
    words = pair_words(b.T if v.attr("transpose_b") else b)
    lhs_words = TensorType(DType.f32, (*lhs.type.shape[:-1], k // 2))
    rhs_words = TensorType(DType.f32, words.shape)
    out_ix = tuple(R.Ix.var(f"i{d}") for d in range(v.type.rank))
    c = Contraction("matmul", {"transpose_a": False, "transpose_b": False}, 0, 1, lhs_words, rhs_words, v.type,
                    R.Load(DType.f32, 2, out_ix, None), 2)
    return PairedKernel(MatmulKernel("matmul", c, [lhs_words, rhs_words], v.type, words, host_isa()))
