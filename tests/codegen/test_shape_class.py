"""One library for a whole shape class: its kernels read the dims at run time, its arena is sized for
the dims' largest values, and its checked entry point solves the dims from the input shapes and
refuses (with a code, touching nothing) any that fall outside the class or disagree with a formula."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from cuvil.codegen import abi
from cuvil.codegen.artifact import ManifestError, build_library, check_manifest
from cuvil.codegen.kernels import tuned_kernels
from cuvil.codegen.shape_class import ShapeClass
from cuvil.errors import CodegenError, ConstraintError, InputError
from cuvil.interp import run_reference
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Module
from cuvil.ir.symbolic import Sym, dim_range, evaluate_dim, parse_dim, sym_max, sym_min
from cuvil.ir.types import DimConstraint
from cuvil.runtime.loader import CompiledModel, CTensor


def _mlp(hi: int | None, lo: int = 1, multiple_of: int = 1) -> Module:
    """x[N, 8] -> relu(x W1 + b1) W2 -> softmax over 4 classes, plus the input's column sums; N <= hi."""
    rng = np.random.default_rng(0)
    b = Builder()
    x = b.param("x", DType.f32, ["N", 8])
    w1 = b.const(rng.standard_normal((8, 16)).astype(np.float32))
    b1 = b.const(rng.standard_normal(16).astype(np.float32))
    w2 = b.const(rng.standard_normal((16, 4)).astype(np.float32))
    h = b.relu(b.add(b.matmul(x, w1), b1))
    y = b.softmax(b.matmul(h, w2), axis=1)
    s = b.reduce_sum(x, axes=[0], keepdims=False)
    return b.module(b.function("main", [x], [y, s, x], ["y", "s", "x_again"],
                               [DimConstraint("N", lo=lo, hi=hi, multiple_of=multiple_of)]))


def _two_inputs() -> Module:
    """a[B, T] and m[B, T] -> a * m and the row sums of a; B <= 4, T <= 16."""
    b = Builder()
    a = b.param("a", DType.f32, ["B", "T"])
    m = b.param("m", DType.f32, ["B", "T"])
    return b.module(b.function("main", [a, m], [b.mul(a, m), b.reduce_sum(a, axes=[1], keepdims=False)],
                               ["p", "r"], [DimConstraint("B", hi=4), DimConstraint("T", hi=16)]))


def _build(module: Module, tmp_path: Path, name: str, **given: int) -> CompiledModel:
    fn = module.main
    art = build_library(fn, module.constants, tmp_path, name=name, shape_class=ShapeClass.of(fn, given or None))
    return CompiledModel(art.library_path)


def test_one_library_runs_every_size_up_to_its_maximum(tmp_path: Path) -> None:
    module = _mlp(hi=None)  # the largest size is the compile's choice, not the model's constraint
    model = _build(module, tmp_path, "mlp", N=32)
    man = model.manifest
    assert man is not None
    assert man["shape_class"]["maxima"] == {"N": 32} and man["inputs"][0]["shape"] == ["N", 8]
    assert "run_dims" in man["symbols"] and "run" not in man["symbols"]
    assert man["arena_bytes"] >= 32 * 16 * 4  # the hidden layer at N = 32
    header = (tmp_path / man["header"]).read_text()
    assert "cuvil_mlp_run_dims(void* ctx, const int64_t* dims" in header and "CUVIL_MLP_DIM_0_MAX 32" in header
    assert "CUVIL_ERR_SHAPE_CLASS 10" in header
    rng = np.random.default_rng(1)
    for n in (1, 5, 32, 2):
        x = rng.standard_normal((n, 8)).astype(np.float32)
        got = model(x)
        want = run_reference(module, {"x": x})
        assert [g.shape for g in got] == [(n, 4), (8,), (n, 8)]
        for g, w in zip(got, want, strict=True):  # sums in the rule's order, not numpy's
            np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-6, err_msg=f"N={n}")
        np.testing.assert_array_equal(got[2], x)
    with pytest.raises(ConstraintError, match="outside the library's shape class") as e:
        model(np.zeros((33, 8), np.float32))
    assert "--dim-max" in (e.value.hint or "")
    with pytest.raises(InputError, match="dim 1"):
        model(np.zeros((3, 9), np.float32))


def _checked(model: CompiledModel) -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    lib = ctypes.CDLL(str(model.library_path))
    man = model.manifest
    assert man is not None
    fn = getattr(lib, man["symbols"]["run_checked"])
    fn.restype = ctypes.c_int32
    fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(CTensor), ctypes.c_int64, ctypes.POINTER(CTensor), ctypes.c_int64]
    return fn


def _tensors(arrays: list[np.ndarray | None], shapes: list[tuple[int, ...]]) -> tuple[ctypes.Array[CTensor], list]:
    table = (CTensor * len(shapes))()
    keep = []
    for k, (a, shape) in enumerate(zip(arrays, shapes, strict=True)):
        dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        keep.append(dims)
        table[k] = CTensor(None if a is None else a.ctypes.data, ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64)),
                           len(shape), abi.DTYPE_CODES[DType.f32])
    return table, keep


@pytest.mark.parametrize(("a_shape", "m_shape", "out_shapes", "code"), [
    ((3, 5), (3, 5), [(3, 5), (3,)], abi.OK),
    ((4, 16), (4, 16), [(4, 16), (4,)], abi.OK),
    ((5, 2), (5, 2), [(5, 2), (5,)], abi.ERR_SHAPE_CLASS),  # B above its maximum
    ((0, 2), (0, 2), [(0, 2), (0,)], abi.ERR_SHAPE_CLASS),  # B below its constraint (lo = 1)
    ((2, 17), (2, 17), [(2, 17), (2,)], abi.ERR_SHAPE_CLASS),
    ((3, 5), (3, 6), [(3, 5), (3,)], abi.ERR_SHAPE),  # m disagrees with a about T
    ((3, 5), (3, 5), [(3, 5), (2,)], abi.ERR_SHAPE),  # an output of the wrong size
])
def test_run_checked_solves_and_checks_the_dims(tmp_path: Path, a_shape: tuple[int, int], m_shape: tuple[int, int],
                                                out_shapes: list[tuple[int, ...]], code: int) -> None:
    module = _two_inputs()
    model = _build(module, tmp_path, "two")
    run_checked = _checked(model)
    lib = model.library_for([np.zeros(a_shape, np.float32), np.zeros(m_shape, np.float32)]) if code == abi.OK else None
    ctx = (lib or model.library_for([np.zeros((1, 1), np.float32)] * 2))._ctx
    rng = np.random.default_rng(2)
    a = rng.standard_normal(a_shape).astype(np.float32)
    m = rng.standard_normal(m_shape).astype(np.float32)
    sentinel = [np.full(s, 7.0, np.float32) for s in out_shapes]
    tin, _k1 = _tensors([a, m], [a_shape, m_shape])
    tout, _k2 = _tensors(list(sentinel), out_shapes)
    assert run_checked(ctx, tin, 2, tout, 2) == code
    if code == abi.OK:
        np.testing.assert_array_equal(sentinel[0], a * m)
        np.testing.assert_allclose(sentinel[1], a.sum(axis=1), rtol=1e-6, atol=1e-6)
    else:
        assert all((o == 7.0).all() for o in sentinel)  # nothing touched


def test_null_data_is_refused_unless_the_tensor_is_empty(tmp_path: Path) -> None:
    b = Builder()
    x = b.param("x", DType.f32, ["N", 3])
    module = b.module(b.function("main", [x], [b.relu(x)], ["y"], [DimConstraint("N", lo=0, hi=8)]))
    model = _build(module, tmp_path, "empty")
    run_checked = _checked(model)
    ctx = model.library_for([np.zeros((1, 3), np.float32)])._ctx
    out = np.zeros((2, 3), np.float32)
    tin, _k1 = _tensors([None], [(2, 3)])
    tout, _k2 = _tensors([out], [(2, 3)])
    assert run_checked(ctx, tin, 1, tout, 1) == abi.ERR_NULL
    tin, _k1 = _tensors([None], [(0, 3)])
    tout, _k2 = _tensors([None], [(0, 3)])
    assert run_checked(ctx, tin, 1, tout, 1) == abi.OK
    assert model(np.zeros((0, 3), np.float32)).shape == (0, 3)


def test_a_multiple_of_constraint_is_checked(tmp_path: Path) -> None:
    model = _build(_mlp(hi=16, multiple_of=4), tmp_path, "mult")
    assert model(np.ones((8, 8), np.float32))[0].shape == (8, 4)
    with pytest.raises(ConstraintError, match="N % 4 == 0"):
        model(np.ones((6, 8), np.float32))


def test_what_a_shape_class_needs_is_refused_clearly() -> None:
    with pytest.raises(CodegenError, match="no largest size") as e:
        ShapeClass.of(_mlp(hi=None).main)
    assert "--dim-max N=" in (e.value.hint or "")
    assert ShapeClass.of(_mlp(hi=None).main, {"N": 64}).maxima == {"N": 64}
    with pytest.raises(CodegenError, match="exceeds its constraint"):
        ShapeClass.of(_mlp(hi=8).main, {"N": 9})
    with pytest.raises(CodegenError, match="not symbolic dims"):
        ShapeClass.of(_mlp(hi=8).main, {"M": 9})
    b = Builder()
    x = b.param("x", DType.f32, [2 * Sym.symbol("N")])  # no input dim is N alone
    fn = b.function("main", [x], [b.relu(x)], ["y"], [DimConstraint("N", hi=4)])
    with pytest.raises(CodegenError, match="no input dim is N alone"):
        ShapeClass.of(fn)


def test_buffers_are_sized_by_each_formula_s_upper_bound() -> None:
    ranges = {"N": (1, 8), "S": (2, 16)}
    assert dim_range(parse_dim("10 - N"), ranges) == (2, 9)  # largest at the smallest N
    assert dim_range(parse_dim("S // 2 + N"), ranges) == (2, 16)
    assert dim_range(parse_dim("S % 5"), ranges) == (0, 4)
    assert dim_range(parse_dim("N*S"), {"N": (1, 8)})[1] is None  # S unbounded
    assert dim_range(parse_dim("((((S - 1)//2)//2 - 1)//2 + 1)"), ranges) == (0, 2)  # a factor may dip below 0
    assert dim_range(parse_dim("(1024*N + 1024)//(N + 1)"), ranges)[1] is not None  # a dim divided by a dim
    assert dim_range(parse_dim("S % N"), ranges) == (0, 7)


def _random_dim(rng: np.random.Generator, depth: int = 0) -> object:
    """A random dim formula over N and S: sums, products, constant and symbolic floor divisions and
    remainders, max/min (what shape arithmetic on imports produces)."""
    if depth > 3 or rng.random() < 0.3:
        return [Sym.symbol("N"), Sym.symbol("S"), int(rng.integers(-3, 9))][int(rng.integers(0, 3))]
    a, b = _random_dim(rng, depth + 1), _random_dim(rng, depth + 1)
    kind = int(rng.integers(0, 6))
    if kind == 0:
        return a + b  # type: ignore[operator]
    if kind == 1:
        return a - b  # type: ignore[operator]
    if kind == 2:
        return a * b  # type: ignore[operator]
    divisor = int(rng.integers(1, 5)) if rng.random() < 0.5 else Sym.symbol("N") + int(rng.integers(0, 3))
    if kind == 3:
        return a // divisor if isinstance(a, Sym) else Sym.lift(a) // divisor  # type: ignore[operator]
    if kind == 4:
        return a % divisor if isinstance(a, Sym) else Sym.lift(a) % divisor  # type: ignore[operator]
    return sym_max(a, b) if rng.random() < 0.5 else sym_min(a, b)  # type: ignore[arg-type]


def test_a_dim_s_range_holds_every_value_it_takes() -> None:
    """The soundness buffers rely on: over random formulas and every point of small ranges, each value
    lies in the interval (an unbounded side bounds nothing)."""
    rng = np.random.default_rng(0)
    ranges = {"N": (1, 5), "S": (0, 7)}
    bounded = 0
    for _ in range(300):
        d = _random_dim(rng)
        lo, hi = dim_range(d, ranges)  # type: ignore[arg-type]
        bounded += hi is not None
        for n in range(1, 6):
            for s_ in range(0, 8):
                v = evaluate_dim(d, {"N": n, "S": s_})  # type: ignore[arg-type]
                assert (lo is None or v >= lo) and (hi is None or v <= hi), (str(d), n, s_, v, lo, hi)
    assert bounded > 200  # most formulas get a finite size


def test_a_manifest_whose_shape_class_was_edited_is_refused(tmp_path: Path) -> None:
    model = _build(_mlp(hi=32), tmp_path, "edit")
    man = model.manifest
    assert man is not None and model.library_path is not None
    check_manifest(man, model.library_path)
    for field, value in (("maxima", {"N": 64}), ("sources", [[0, 1]]), ("symbols", ["N", "M"])):
        bad = {**man, "shape_class": {**man["shape_class"], field: value}}
        with pytest.raises(ManifestError, match=r"shape_class|inputs"):
            check_manifest(bad, model.library_path)
    for hostile in ("M", "(" * 5000 + "N" + ")" * 5000, "N // 0", "N" * 3000, 7.5, None):
        with pytest.raises(ManifestError, match="inputs"):
            check_manifest({**man, "inputs": [{**man["inputs"][0], "shape": [hostile, 8]}]}, model.library_path)
    with pytest.raises(ManifestError, match="symbols"):
        check_manifest({**man, "symbols": {**man["symbols"], "run": "cuvil_edit_run"}}, model.library_path)


@pytest.mark.parametrize("dtype", [DType.f32, DType.f16, DType.i64, DType.bool, DType.i4])
def test_a_reshape_over_symbolic_dims_is_a_copy_of_its_bytes(tmp_path: Path, dtype: DType) -> None:
    """The copy kernel (the reshape whose result the caller receives) and the view (the reshape of the
    input, which runs no kernel) are the rule bit for bit, for every storage type (NaN payloads too)."""
    b = Builder()
    x = b.param("x", dtype, ["B", "S", 8])
    bs, ss = x.type.shape[0], x.type.shape[1]
    y = b.reshape(b.transpose(b.reshape(x, shape=[bs, ss, 2, 4]), perm=[0, 2, 1, 3]), shape=[bs, 2 * ss, 4])
    module = b.module(b.function("main", [x], [y], ["y"], [DimConstraint("B", hi=4), DimConstraint("S", hi=9)]))
    model = _build(module, tmp_path, f"copy_{dtype.value}")
    man = model.manifest
    assert man is not None
    if "matmul" in tuned_kernels():
        assert man["kernels"].count("copy") == 1 and man["kernels"].count("view") == 1, man["kernels"]
    rng = np.random.default_rng(5)
    for shape in ((1, 1, 8), (4, 9, 8), (3, 5, 8)):
        raw = rng.integers(0, 256, size=(*shape, dtype.np.itemsize), dtype=np.uint8)
        if dtype is DType.bool:
            raw = raw % 2
        elif dtype is DType.i4:
            raw = raw % 8
        data = raw.view(dtype.np).reshape(shape)
        (want,) = run_reference(module, {"x": data})
        got = model(data)
        assert got.shape == want.shape and got.tobytes() == np.ascontiguousarray(want).tobytes()
