"""The tuned GEMM with its rows read at run time, for a function compiled once for its shape class:
each kernel is compiled once (all of them in one library, to keep compile time down), run at
several sizes through its trailing ``dims`` argument (M = 0, 1, sizes that are not a multiple of
the register tile, one large enough for the thread pool) and compared with the interpreter,
within the tolerance of tests/codegen/test_kernels.py. At a size the static kernel also has, the
bits are the static kernel's (the same schedule: each output is the same chain of FMAs over K).
What the run-time kernel does not take is declined (None: the rule kernel computes it)."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from llvmlite import ir

from cuvil.codegen.kernels import Kernel, generic_only, select_kernel, select_symbolic_kernel
from cuvil.codegen.link import emit_object, host_target, link_shared, optimize, target_machine
from cuvil.codegen.scalar import I32, PTR
from cuvil.interp import run_reference
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Function, Module
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
    """One kernel: its module, the sizes it runs at (each an env of its symbols) and its K."""

    name: str
    module: Module
    sizes: list[dict[str, int]]
    k: int
    maxima: dict[str, int]

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


def _cases() -> list[Case]:
    s_max, b_max = DimConstraint("S", lo=0, hi=512), DimConstraint("B", lo=0, hi=4)
    small = DimConstraint("S", lo=0, hi=16)
    bs = [{"B": 0, "S": 3}, {"B": 1, "S": 1}, {"B": 2, "S": 5}, {"B": 3, "S": 13}, {"B": 4, "S": 16}]
    return [
        Case("plain_2d", _module(_plain_2d, s_max), [{"S": n} for n in (0, 1, 7, 13, 512)], 256, {"S": 512}),
        Case("bias_relu_3d", _module(_bias_relu_3d, b_max, small), bs, 40, {"B": 4, "S": 16}),
        Case("residual_3d", _module(_residual_3d, b_max, small), bs, 24, {"B": 4, "S": 16}),
        Case("static_batch", _module(_static_batch, small), [{"S": n} for n in (1, 9, 16)], 33, {"S": 16}),
        Case("transposed_long_k", _module(_transposed_long_k, s_max), [{"S": n} for n in (1, 11)], 300,
             {"S": 512}),
    ]


CASES = _cases()
STATIC_M = 512  # the plain 2-D case compiled at this static size too, for the bits


def _static_plain() -> tuple[Module, Kernel]:
    """The plain 2-D case at ``M = STATIC_M`` (the same constant weights), on the static tuned GEMM."""
    module = CASES[0].module
    b = Builder(module.constants)
    x = b.param("x", F32, [STATIC_M, 256])
    static = b.module(Function("main", (x,), (b.matmul(x, module.main.results[0].operands[1]),), ("y",)))
    kernel = select_kernel(static.main.results[0], static.constants)
    assert kernel is not None
    return static, kernel


def _entry(mod: ir.Module, name: str, kernel: Kernel, n_args: int) -> None:
    """``i32 name(args...)`` calling the kernel (a kernel itself is hidden in the library)."""
    fn = kernel.emit(mod, f"kernel.{name}")
    entry = ir.Function(mod, ir.FunctionType(I32, [PTR] * n_args), name=name)
    b = ir.IRBuilder(entry.append_basic_block())
    b.ret(b.call(fn, list(entry.args)))


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    mod = ir.Module(name="symgemm")  # the library's prefix (the thread pool's symbols)
    for case in CASES:
        kernel = case.kernel()
        assert kernel is not None, case.name
        assert kernel.name.startswith("gemm.") and kernel.name.endswith(".runtime_m")
        assert kernel.scratch_bytes == 0
        _entry(mod, case.name, kernel, len(case.value.operands) + 3)  # out, inputs, scratch, dims
    _entry(mod, "static_plain", _static_plain()[1], 4)  # out, x, w, scratch
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
def test_runtime_rows_match_the_interpreter(library: ctypes.CDLL, case: Case) -> None:
    fn = getattr(library, case.name)
    fn_main = case.module.main
    for env in case.sizes:
        inputs = {p.name: _f32(*p.type.concrete(env)) for p in fn_main.params}
        want = run_reference(case.module, inputs)[0]
        out = np.full(want.shape, np.nan, np.float32)
        dims = np.array([env[s] for s in case.symbols], np.int64)
        assert _call(fn, case.module, inputs, out, dims) == 0, f"{case.name} {env}"
        assert_close(out, want, case.k, f"{case.name} at {env}")


def test_runtime_rows_give_the_static_kernels_bits(library: ctypes.CDLL) -> None:
    static, _ = _static_plain()
    x = _f32(STATIC_M, 256)
    got, want = np.empty((STATIC_M, 256), np.float32), np.empty((STATIC_M, 256), np.float32)
    assert _call(library.plain_2d, CASES[0].module, {"x": x}, got, np.array([STATIC_M], np.int64)) == 0
    assert _call(library.static_plain, static, {"x": x}, want, None) == 0
    np.testing.assert_array_equal(got, want)


def _declined(build: Callable[[Builder], tuple[list[Value], Value]], maxima: dict[str, int]) -> Kernel | None:
    module = _module(build, *(DimConstraint(s, lo=0, hi=n) for s, n in maxima.items()))
    return select_symbolic_kernel(module.main.results[0], module.constants, tuple(sorted(maxima)), maxima)


DECLINED: dict[str, tuple[Callable[[Builder], tuple[list[Value], Value]], dict[str, int]]] = {
    "activation rhs": (lambda b: ([x := b.param("x", F32, ["S", 8]), w := b.param("w", F32, [8, 4])],
                                  b.matmul(x, w)), {"S": 8}),
    "symbolic K": (lambda b: ([x := b.param("x", F32, ["S", "K"])], b.matmul(x, b.const(_f32(8, 4)))),
                   {"S": 8, "K": 8}),
    "transposed lhs": (lambda b: ([x := b.param("x", F32, [8, "S"])],
                                  b.matmul(x, b.const(_f32(8, 4)), transpose_a=True)), {"S": 8}),
    "batched rhs": (lambda b: ([x := b.param("x", F32, [2, "S", 8])], b.matmul(x, b.const(_f32(2, 8, 4)))),
                    {"S": 8}),
    "row-broadcast residual": (lambda b: ([x := b.param("x", F32, ["B", "S", 8]), r := b.param("r", F32, ["S", 4])],
                                          b.relu(b.add(b.matmul(x, b.const(_f32(8, 4))), r))), {"B": 2, "S": 8}),
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
