"""Rule kernels over symbolic extents: one kernel per op, compiled once with its dims read at run time
from an ``i64`` array, gives at every size the bits of the kernel compiled for that size (the same
schedule of the op's rule), and agrees with the interpreter's strict reading of the rule (exactly
where the rule has no transcendental function), index errors included."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from llvmlite import ir

from cuvil.codegen.link import emit_object, host_target, link_shared, optimize, target_machine
from cuvil.codegen.llvm_types import I32, PTR
from cuvil.codegen.lower_rule import emit_rule_kernel
from cuvil.interp import evaluate_op
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.opdef import get_op
from cuvil.ir.specialize import bind_attr
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value

Make = Callable[[Builder], Value]
SIZES = ({"N": 1, "K": 2}, {"N": 3, "K": 5}, {"N": 7, "K": 1})
TRANSCENDENTAL = {"softmax"}


def _cases() -> dict[str, Make]:
    f32 = DType.f32
    return {
        "add-broadcast": lambda b: b.add(b.param("x", f32, ["N", 3]), b.param("y", f32, [3])),
        "reduce-over-n": lambda b: b.reduce_sum(b.param("x", f32, ["N", 5]), axes=[0], keepdims=False),
        "reduce-keep-n": lambda b: b.reduce_max(b.param("x", f32, ["N", "K"]), axes=[1], keepdims=True),
        "matmul": lambda b: b.matmul(b.param("a", f32, ["N", "K"]), b.param("w", f32, ["K", 4])),
        "softmax": lambda b: b.softmax(b.param("x", f32, ["N", "K"]), axis=1),
        "transpose": lambda b: b.transpose(b.param("x", f32, ["N", 3, "K"]), perm=[2, 0, 1]),
        "reshape": lambda b: b.reshape(b.param("x", f32, ["N", 6]), shape=["N*2", 3]),
        "concat": lambda b: b.concat(b.param("x", f32, ["N", 2]), b.param("y", f32, [3, 2]), axis=0),
        "gather": lambda b: b.gather(b.param("x", f32, ["N", 4]), b.param("i", DType.i64, ["K"]), axis=0),
        "cumsum": lambda b: b.cumsum(b.param("x", f32, ["N", 2]), axis=0),
        "layer_norm": lambda b: b.layer_norm(b.param("x", f32, ["N", "K"]), b.param("g", f32, ["K"]),
                                             b.param("h", f32, ["K"]), axis=1),
    }


def _build(name: str, v: Value, symbols: tuple[str, ...] | None, tmp: Path, env: dict[str, int] | None = None
           ) -> Callable[..., int]:
    """The kernel of ``v`` over its symbolic dims (``symbols``), or specialized at ``env``."""
    mod = ir.Module(name=name)
    in_types = [o.type for o in v.operands]
    out_type = v.type
    if env is not None:
        in_types = [TensorType(t.dtype, t.concrete(env)) for t in in_types]
        out_type = TensorType(v.dtype, v.type.concrete(env))
    attrs = {k: bind_attr(a, env) for k, a in v.attr_dict.items()} if env is not None else v.attr_dict
    rule = get_op(v.op).make_rule(in_types, attrs, out_type)
    kernel = emit_rule_kernel(mod, "kernel", rule, in_types, out_type, v.op, dims=symbols)
    extra = 1 if symbols is not None else 0
    entry = ir.Function(mod, ir.FunctionType(I32, [PTR] * (len(in_types) + 1 + extra)), name="entry")
    b = ir.IRBuilder(entry.append_basic_block())
    b.ret(b.call(kernel, list(entry.args)))
    tm = target_machine(host_target(), 2)
    path = tmp / f"{name}.so"
    link_shared(emit_object(optimize(mod, tm, 2), tm), path)
    fn = ctypes.CDLL(str(path)).entry
    fn.restype = ctypes.c_int32
    return fn


def _inputs(v: Value, env: dict[str, int], rng: np.random.Generator) -> list[np.ndarray]:
    out = []
    for o in v.operands:
        shape = o.type.concrete(env)
        if o.dtype.is_float:
            out.append(rng.standard_normal(shape).astype(o.dtype.np))
        else:
            out.append(rng.integers(-env["N"], env["N"], shape).astype(o.dtype.np))
    return out


@pytest.mark.parametrize("case", sorted(_cases()))
def test_one_kernel_serves_every_size_bit_for_bit(case: str, tmp_path: Path) -> None:
    b = Builder()
    v = _cases()[case](b)
    symbols = tuple(sorted(v.type.symbols() | set().union(*(o.type.symbols() for o in v.operands))))
    fn = _build(case.replace("-", "_"), v, symbols, tmp_path)
    rng = np.random.default_rng(len(case))
    for env in SIZES:
        xs = _inputs(v, env, rng)
        out_type = TensorType(v.dtype, v.type.concrete(env))
        want = evaluate_op(get_op(v.op), xs, v.attr_dict, out_type, use_fast_path=False)
        got = np.empty(out_type.concrete({}), dtype=v.dtype.np)
        dims = np.array([env[s] for s in symbols], dtype=np.int64)
        args = [got.ctypes.data_as(ctypes.c_void_p), *(x.ctypes.data_as(ctypes.c_void_p) for x in xs),
                dims.ctypes.data_as(ctypes.c_void_p)]
        rc = fn(*args)
        assert rc == 0, (case, env)
        static = _build(f"{case.replace('-', '_')}_{'_'.join(map(str, env.values()))}", v, None, tmp_path, env)
        fixed = np.empty_like(got)
        assert static(*[fixed.ctypes.data_as(ctypes.c_void_p), *args[1:-1]]) == 0
        np.testing.assert_array_equal(got.view(np.uint8), fixed.view(np.uint8), err_msg=f"{case} at {env}")
        if case in TRANSCENDENTAL:  # libm's exp and numpy's may differ in the last place
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=f"{case} at {env}")
        else:
            np.testing.assert_array_equal(got.view(np.uint8), np.ascontiguousarray(want).view(np.uint8),
                                          err_msg=f"{case} at {env}")


def test_an_index_out_of_a_symbolic_range_is_an_error(tmp_path: Path) -> None:
    b = Builder()
    v = _cases()["gather"](b)
    fn = _build("gather_oob", v, ("K", "N"), tmp_path)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = np.empty((2, 4), np.float32)
    for idx, rc in (([0, -3], 0), ([2, 3], 6), ([-4, 0], 6)):  # N = 3: indices in [-3, 3)
        i = np.array(idx, np.int64)
        dims = np.array([2, 3], np.int64)
        assert fn(got.ctypes.data_as(ctypes.c_void_p), x.ctypes.data_as(ctypes.c_void_p),
                  i.ctypes.data_as(ctypes.c_void_p), dims.ctypes.data_as(ctypes.c_void_p)) == rc, idx
