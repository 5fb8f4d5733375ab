"""The tuned GEMM with its sizes read at run time, for a function compiled once for its shape class:
each kernel is compiled once (all of them in one library, to keep compile time down), run at
several sizes through its trailing ``dims`` argument (empty outputs, K = 0, 1, sizes that are not a
multiple of the register tile, one large enough for the thread pool) and compared with the
interpreter, within the tolerance of tests/codegen/test_kernels.py. Symbolic rows of a constant
weight (a linear layer), attention's products (batch, M, N or K symbolic, an activation rhs,
transposed or not, with a scale and mask epilogue) and a 2-D GEMM with M, N and K all symbolic.
At a size the static kernel is tiled for, the bits are the static kernel's (the same schedule: each
output is the same chain of FMAs over K). What the run-time kernel does not take is declined (None:
the rule kernel computes it)."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from llvmlite import ir

from cuvil.codegen.kernels import Kernel, generic_only, operand_data, select_kernel, select_symbolic_kernel
from cuvil.codegen.link import emit_object, host_target, link_shared, optimize, target_machine
from cuvil.codegen.llvm_types import I32, PTR
from cuvil.interp import run_reference
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Function, Module
from cuvil.ir.specialize import specialize_dims
from cuvil.ir.types import DimConstraint
from cuvil.ir.values import Value
from cuvil.passes.fuse_elementwise import FuseElementwise
from tests.codegen.test_kernels import assert_close

RNG = np.random.default_rng(5)
F32 = DType.f32


def _f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _module(build: Callable[[Builder], tuple[list[Value], Value]], *constraints: DimConstraint) -> Module:
    """One result, ``build``'s, after elementwise fusion (so an epilogue is a ``fused`` value)."""
    b = Builder()
    params, result = build(b)
    module = b.module(Function("main", tuple(params), (result,), ("y",), tuple(constraints)))
    return FuseElementwise().run(module).module


@dataclass
class Case:
    """One kernel: its module, the sizes it runs at (each an env of its symbols), its K (the symbol
    when K is symbolic), the maxima it is compiled for and which of its sizes (batch, m, n, k) are
    read at run time."""

    name: str
    module: Module
    sizes: list[dict[str, int]]
    k: int | str
    maxima: dict[str, int]
    runtime: str = "m"

    @property
    def value(self) -> Value:
        return self.module.main.results[0]

    @property
    def symbols(self) -> tuple[str, ...]:
        return tuple(sorted(self.maxima))

    def kernel(self) -> Kernel | None:
        return select_symbolic_kernel(self.value, self.module.constants, self.symbols, self.maxima)


def _plain_2d(b: Builder) -> tuple[list[Value], Value]:
    x = b.param("x", F32, ["S", 256])
    return [x], b.matmul(x, b.const(_f32(256, 256)))


def _bias_relu_3d(b: Builder) -> tuple[list[Value], Value]:
    x = b.param("x", F32, ["B", "S", 40])
    return [x], b.relu(b.add(b.matmul(x, b.const(_f32(40, 37))), b.const(_f32(37))))


def _residual_3d(b: Builder) -> tuple[list[Value], Value]:
    x, r = b.param("x", F32, ["B", "S", 24]), b.param("r", F32, ["B", "S", 70])
    return [x, r], b.relu(b.add(b.add(b.matmul(x, b.const(_f32(24, 70))), b.const(_f32(70))), r))


def _static_batch(b: Builder) -> tuple[list[Value], Value]:
    x = b.param("x", F32, [2, "S", 33])
    return [x], b.relu(b.matmul(x, b.const(_f32(33, 70))))


def _transposed_long_k(b: Builder) -> tuple[list[Value], Value]:
    x = b.param("x", F32, ["S", 300])  # K over one cache block: partial sums kept between blocks
    return [x], b.matmul(x, b.const(_f32(20, 300)), transpose_b=True)


def _scores(b: Builder) -> tuple[list[Value], Value]:
    q, k = b.param("q", F32, ["B", 2, "S", 20]), b.param("k", F32, ["B", 2, "S", 20])
    return [q, k], b.matmul(q, k, transpose_b=True)


def _scores_scaled_masked(b: Builder) -> tuple[list[Value], Value]:
    """``Q @ K^T`` with K^T already laid out ``[B, H, dk, S]``, by a constant scale, plus a mask."""
    q, kt = b.param("q", F32, ["B", 2, "S", 20]), b.param("kt", F32, ["B", 2, 20, "S"])
    mask = b.param("mask", F32, ["B", 1, 1, "S"])
    return [q, kt, mask], b.add(b.mul(b.matmul(q, kt), b.const(np.float32(0.125))), mask)


def _context(b: Builder) -> tuple[list[Value], Value]:
    p, v = b.param("p", F32, ["B", 2, "S", "S"]), b.param("v", F32, ["B", 2, "S", 20])
    return [p, v], b.matmul(p, v)


def _all_symbolic_2d(b: Builder) -> tuple[list[Value], Value]:
    x, w, bias = b.param("x", F32, ["M", "K"]), b.param("w", F32, ["K", "N"]), b.param("bias", F32, ["N"])
    return [x, w, bias], b.relu(b.add(b.matmul(x, w), bias))


def _both_transposed(b: Builder) -> tuple[list[Value], Value]:
    x, w = b.param("x", F32, ["K", "S"]), b.param("w", F32, [12, "K"])
    return [x, w], b.matmul(x, w, transpose_a=True, transpose_b=True)


def _row_broadcast_residual(b: Builder) -> tuple[list[Value], Value]:
    x, r = b.param("x", F32, ["B", "S", 8]), b.param("r", F32, ["S", 4])  # not the rows view: one GEMM per B
    return [x, r], b.relu(b.add(b.matmul(x, b.const(_f32(8, 4))), r))


def _broadcast_rhs_batch(b: Builder) -> tuple[list[Value], Value]:
    x, w = b.param("x", F32, ["B", 2, "S", 12]), b.param("w", F32, [1, 2, 12, 5])  # w's first dim broadcast
    return [x, w], b.matmul(x, w)


def _batched_constant(b: Builder) -> tuple[list[Value], Value]:
    x = b.param("x", F32, [2, "S", 8])
    return [x], b.matmul(x, b.const(_f32(2, 8, 4)))


def _cases() -> list[Case]:
    s_max, b_max = DimConstraint("S", lo=0, hi=512), DimConstraint("B", lo=0, hi=4)
    small = DimConstraint("S", lo=0, hi=16)
    bs = [{"B": 0, "S": 3}, {"B": 1, "S": 1}, {"B": 2, "S": 5}, {"B": 3, "S": 13}, {"B": 4, "S": 16}]
    b_att, s_att = DimConstraint("B", lo=0, hi=3), DimConstraint("S", lo=0, hi=300)
    # empty batch, S = 0 (K = 0 too for the context), one, odd sizes, the pool, two K blocks of the context
    attention = [{"B": 0, "S": 5}, {"B": 2, "S": 0}, {"B": 1, "S": 1}, {"B": 2, "S": 13}, {"B": 3, "S": 70},
                 {"B": 2, "S": 130}, {"B": 1, "S": 300}]
    mnk = tuple(DimConstraint(s, lo=0, hi=n) for s, n in (("M", 200), ("N", 100), ("K", 300)))
    mnk_sizes = [{"M": 0, "N": 5, "K": 3}, {"M": 4, "N": 0, "K": 3}, {"M": 5, "N": 7, "K": 0},
                 {"M": 1, "N": 1, "K": 1}, {"M": 13, "N": 29, "K": 37}, {"M": 200, "N": 100, "K": 300}]
    return [
        Case("plain_2d", _module(_plain_2d, s_max), [{"S": n} for n in (0, 1, 7, 13, 512)], 256, {"S": 512}),
        Case("bias_relu_3d", _module(_bias_relu_3d, b_max, small), bs, 40, {"B": 4, "S": 16}),
        Case("residual_3d", _module(_residual_3d, b_max, small), bs, 24, {"B": 4, "S": 16}),
        Case("static_batch", _module(_static_batch, small), [{"S": n} for n in (1, 9, 16)], 33, {"S": 16}),
        Case("transposed_long_k", _module(_transposed_long_k, s_max), [{"S": n} for n in (1, 11)], 300,
             {"S": 512}),
        Case("scores", _module(_scores, b_att, s_att), attention, 20, {"B": 3, "S": 300}, "bmn"),
        Case("scores_scaled_masked", _module(_scores_scaled_masked, b_att, s_att), attention, 20,
             {"B": 3, "S": 300}, "bmn"),
        Case("context", _module(_context, b_att, s_att), attention, "S", {"B": 3, "S": 300}, "bmk"),
        Case("all_symbolic_2d", _module(_all_symbolic_2d, *mnk), mnk_sizes, "K", {"M": 200, "N": 100, "K": 300},
             "mnk"),
        Case("both_transposed", _module(_both_transposed, s_max, DimConstraint("K", lo=0, hi=40)),
             [{"S": 0, "K": 3}, {"S": 7, "K": 0}, {"S": 1, "K": 1}, {"S": 19, "K": 40}], "K", {"S": 512, "K": 40},
             "mk"),
        Case("row_broadcast_residual", _module(_row_broadcast_residual, b_max, small), bs, 8, {"B": 4, "S": 16},
             "bm"),
        Case("broadcast_rhs_batch", _module(_broadcast_rhs_batch, b_max, small), bs, 12, {"B": 4, "S": 16}, "bm"),
        Case("batched_constant", _module(_batched_constant, small), [{"S": n} for n in (0, 1, 9, 16)], 8, {"S": 16}),
    ]


CASES = _cases()
BY_NAME = {c.name: c for c in CASES}
STATIC = {"plain_2d": {"S": 512}, "context": {"B": 1, "S": 300}, "scores": {"B": 2, "S": 300}}
"""Cases also compiled at these static sizes (the ones their run-time tiling is chosen for), for the bits."""


def _static(name: str) -> tuple[Module, Kernel]:
    """Case ``name`` at its ``STATIC`` sizes (the same constants), on the static tuned GEMM."""
    module = BY_NAME[name].module
    static = Module((specialize_dims(module.main, STATIC[name]),), module.constants)
    kernel = select_kernel(static.main.results[0], static.constants)
    assert kernel is not None
    return static, kernel


def _entry(mod: ir.Module, name: str, kernel: Kernel, n_args: int) -> None:
    """``i32 name(args...)`` calling the kernel (a kernel itself is hidden in the library), with the data the
    kernel takes in operand slots (its packed weights) in place of those operands, as the code generator calls it."""
    fn = kernel.emit(mod, f"kernel.{name}")
    data = operand_data(kernel, mod, f"kernel.{name}")
    entry = ir.Function(mod, ir.FunctionType(I32, [PTR] * n_args), name=name)
    b = ir.IRBuilder(entry.append_basic_block())
    b.ret(b.call(fn, [data.get(j - 1, a) for j, a in enumerate(entry.args)]))


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    mod = ir.Module(name="symgemm")  # the library's prefix (the thread pool's symbols)
    for case in CASES:
        kernel = case.kernel()
        assert kernel is not None, case.name
        assert kernel.name.startswith("gemm.") and kernel.name.endswith(f".runtime_{case.runtime}"), kernel.name
        assert kernel.scratch_bytes == 0
        _entry(mod, case.name, kernel, len(case.value.operands) + 3)  # out, inputs, scratch, dims
    for name in STATIC:
        static = _static(name)
        _entry(mod, f"static_{name}", static[1], len(static[0].main.results[0].operands) + 2)  # out, inputs, scratch
    tm = target_machine(host_target(), 2)
    path = tmp_path_factory.mktemp("symgemm") / "libsymgemm.so"
    link_shared(emit_object(optimize(mod, tm, 2), tm), path)
    return ctypes.CDLL(str(path))


def _call(fn: Callable[..., int], module: Module, inputs: dict[str, np.ndarray], out: np.ndarray,
          dims: np.ndarray | None) -> int:
    v = module.main.results[0]
    arrays = [inputs[o.name] if o.is_param else module.constants[o.const_hash] for o in v.operands]
    args = [out.ctypes.data, *(a.ctypes.data for a in arrays), None]
    if dims is not None:
        args.append(dims.ctypes.data)
    fn.restype = ctypes.c_int32  # type: ignore[attr-defined]
    return fn(*(ctypes.c_void_p(a) for a in args))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_runtime_sizes_match_the_interpreter(library: ctypes.CDLL, case: Case) -> None:
    fn = getattr(library, case.name)
    fn_main = case.module.main
    for env in case.sizes:
        inputs = {p.name: _f32(*p.type.concrete(env)) for p in fn_main.params}
        want = run_reference(case.module, inputs)[0]
        out = np.full(want.shape, np.nan, np.float32)
        dims = np.array([env[s] for s in case.symbols], np.int64)
        assert _call(fn, case.module, inputs, out, dims) == 0, f"{case.name} {env}"
        k = case.k if isinstance(case.k, int) else env[case.k]
        assert_close(out, want, k, f"{case.name} at {env}")


@pytest.mark.parametrize("name", list(STATIC))
def test_runtime_sizes_give_the_static_kernels_bits(library: ctypes.CDLL, name: str) -> None:
    case, env = BY_NAME[name], STATIC[name]
    static, _ = _static(name)
    inputs = {p.name: _f32(*p.type.concrete(env)) for p in case.module.main.params}
    shape = case.value.type.concrete(env)
    got, want = np.empty(shape, np.float32), np.empty(shape, np.float32)
    dims = np.array([env[s] for s in case.symbols], np.int64)
    assert _call(getattr(library, name), case.module, inputs, got, dims) == 0
    assert _call(getattr(library, f"static_{name}"), static, inputs, want, None) == 0
    np.testing.assert_array_equal(got, want)


def _declined(build: Callable[[Builder], tuple[list[Value], Value]], maxima: dict[str, int]) -> Kernel | None:
    module = _module(build, *(DimConstraint(s, lo=0, hi=n) for s, n in maxima.items()))
    return select_symbolic_kernel(module.main.results[0], module.constants, tuple(sorted(maxima)), maxima)


DECLINED: dict[str, tuple[Callable[[Builder], tuple[list[Value], Value]], dict[str, int]]] = {
    "K equal only at run time": (lambda b: ([x := b.param("x", F32, ["S", "K"])], b.matmul(x, b.const(_f32(8, 4)))),
                                 {"S": 8, "K": 8}),
    "batch broadcast only at some sizes": (lambda b: ([x := b.param("x", F32, ["B", "S", 8]),
                                                       w := b.param("w", F32, ["C", 8, 4])], b.matmul(x, w)),
                                           {"B": 2, "C": 2, "S": 8}),
    "float64": (lambda b: ([x := b.param("x", DType.f64, ["S", 8]), w := b.param("w", DType.f64, [8, "N"])],
                           b.matmul(x, w)), {"S": 8, "N": 8}),
    "conv": (lambda b: ([x := b.param("x", F32, ["N", 2, 5, 5])], b.conv(x, b.const(_f32(3, 2, 3, 3)))),
             {"N": 2}),
}


@pytest.mark.parametrize("what", list(DECLINED))
def test_what_it_does_not_take_is_declined(what: str) -> None:
    build, maxima = DECLINED[what]
    assert _declined(build, maxima) is None


def test_declined_when_tuned_kernels_are_off() -> None:
    assert CASES[1].kernel() is not None
    with generic_only():
        assert CASES[1].kernel() is None
