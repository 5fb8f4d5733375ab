"""The fail-safe guard in compiled libraries: policies read strictly, value checks in native code
(inputs finite and in their box, outputs finite), GuardFault with the policy's mode, the C ABI, the
manifest and the cache key."""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import json
import math
import shutil
import subprocess
from fractions import Fraction
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from cuvil.cli import main
from cuvil.codegen import abi
from cuvil.codegen.artifact import IntegrityError
from cuvil.compiler import compile
from cuvil.errors import CodegenError, CuvilError, FileAccessError, InputError, RuntimeEvalError
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Module
from cuvil.ir.printer import export_ir
from cuvil.ir.symbolic import sym
from cuvil.runtime import GuardFault, load
from cuvil.runtime.loader import CTensor
from failsafe.guard import GuardSpec, read_policy
from failsafe.policy import FORMAT, Policy, PolicyError, digest_of

CC = shutil.which("cc")
RNG = np.random.default_rng(5)
W = RNG.standard_normal((4, 5)).astype(np.float32)


@pytest.fixture(autouse=True)
def _cache(private_cache: Path) -> Path:
    return private_cache


def make_policy(inputs: dict[str, list[float]] | None = None, *, input_fault: str | None = "input_box",
                output_fault: str | None = "output_nan", table: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A policy document as the synthesis writes it (digest included): three modes, two guard faults."""
    faults = [{"name": "sensor_lost", "kind": "sensor"}, {"name": "input_box", "kind": "input-box"},
              {"name": "output_nan", "kind": "non-finite"}]
    rows = table if table is not None else [
        {"scenario": "none", "faults": [], "mode": "nominal", "parameters": {"cap": 27.5}, "verdict": "proved",
         "seconds": 0.1, "candidates_rejected": 2, "counterexamples": []},
        {"scenario": "input_box", "faults": ["input_box"], "mode": "degraded", "parameters": {"cap": 10.0},
         "verdict": "proved"},
        {"scenario": "output_nan", "faults": ["output_nan"], "mode": "stop", "parameters": {"cap": 0.0},
         "verdict": "proved"},
        {"scenario": "input_box+output_nan", "faults": ["input_box", "output_nan"], "mode": "stop",
         "parameters": {"cap": 0.0}, "verdict": "proved"},
    ]
    doc: dict[str, Any] = {
        "format": FORMAT,
        "spec": {"name": "vehicle", "digest": "ab" * 32, "source": "specs/vehicle.yaml"},
        "state": {"speed": {"lo": 0, "hi": 33.3, "unit": "m/s"}},
        "faults": faults,
        "modes": ["nominal", "degraded", "stop"],
        "table": rows,
        "unrealizable": [{"scenario": "sensor_lost+input_box+output_nan",
                          "faults": ["sensor_lost", "input_box", "output_nan"], "state": None, "per_mode": []}],
        "guard": {"inputs": inputs if inputs is not None else {"x": [-1.0, 1.0]}, "input_fault": input_fault,
                  "output_fault": output_fault},
    }
    doc["digest"] = digest_of(doc)
    return doc


def redigest(doc: dict[str, Any]) -> dict[str, Any]:
    doc["digest"] = digest_of(doc)
    return doc


def affine_module() -> Module:
    """y = tanh(x W): finite for every finite x."""
    b = Builder()
    x = b.param("x", DType.f32, [3, 4])
    return b.module(b.function("affine", [x], [b.tanh(b.matmul(x, b.const(W)))], ["y"]))


def mixed_module() -> Module:
    """Three inputs: x f32 (boxed), ids i64 (boxed; gathered rows of x), z f64 (only finite)."""
    b = Builder()
    x = b.param("x", DType.f32, [3, 4])
    ids = b.param("ids", DType.i64, [2])
    z = b.param("z", DType.f64, [5])
    y = b.mul(b.gather(x, ids, axis=0), b.const(np.float32(2.0)))
    return b.module(b.function("mixed", [x, ids, z], [y, b.add(z, z)], ["y", "w"]))


def exp_module() -> Module:
    """y = exp(x): overflows to inf in float32 for x above about 88.7."""
    b = Builder()
    x = b.param("x", DType.f32, [2, 3])
    return b.module(b.function("expo", [x], [b.exp(x)], ["y"]))


def mixed_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.uniform(-1, 1, (3, 4)).astype(np.float32), np.array([2, 0], np.int64),
            rng.standard_normal(5)]


MIXED_POLICY = {"x": [-1.0, 1.0], "ids": [0, 2]}


def fault_of(model: Any, *inputs: np.ndarray) -> GuardFault:
    with pytest.raises(GuardFault) as info:
        model(*inputs)
    out, fault = model.run_guarded(*inputs)
    assert out is None and isinstance(fault, GuardFault) and fault.return_code == info.value.return_code
    return info.value


# --------------------------------------------------------------------------------------
# values in the box: the guarded library computes exactly what the plain one does


@pytest.mark.parametrize("build,boxes", [(affine_module, {"x": [-1.0, 1.0]}), (mixed_module, MIXED_POLICY)])
def test_in_box_inputs_run_bit_identically_to_the_unguarded_library(build, boxes):
    module = build()
    plain, guarded = compile(module), compile(module, failsafe=make_policy(boxes))
    rng = np.random.default_rng(0)
    for trial in range(4):
        inputs = mixed_inputs(rng) if build is mixed_module else [rng.uniform(-1, 1, (3, 4)).astype(np.float32)]
        if trial == 1:  # the box's own bounds are inside it
            inputs[0][0, 0], inputs[0][-1, -1] = -1.0, 1.0
        want, got = plain.run(inputs), guarded.run(inputs)
        for w, g in zip(want, got, strict=True):
            assert w.dtype == g.dtype and w.tobytes() == g.tobytes()
        out, fault = guarded.run_guarded(*inputs)
        assert fault is None
        assert [o.tobytes() for o in (out if isinstance(out, tuple) else (out,))] == [w.tobytes() for w in want]


# --------------------------------------------------------------------------------------
# faults


@pytest.mark.parametrize("where", [(0, 0), (1, 2), (2, 3)])
@pytest.mark.parametrize("side", ["above", "below"])
def test_an_element_outside_the_box_raises_with_the_policys_mode(where, side):
    model = compile(affine_module(), failsafe=make_policy())
    x = np.zeros((3, 4), np.float32)
    x[where] = np.nextafter(np.float32(1.0 if side == "above" else -1.0),
                            np.float32(np.inf if side == "above" else -np.inf))
    fault = fault_of(model, x)
    assert isinstance(fault, CuvilError) and fault.code == "CUVIL-FAILSAFE-GUARD"
    assert (fault.return_code, fault.check) == (abi.ERR_INPUT_BOX, "ERR_INPUT_BOX")
    assert (fault.fault, fault.mode, fault.parameters) == ("input_box", "degraded", {"cap": 10.0})
    assert (fault.tensor, fault.index) == ("x", where[0] * 4 + where[1])
    assert "input_box" in str(fault) and "degraded" in str(fault)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_inputs_boxed_or_not(value):
    model = compile(mixed_module(), failsafe=make_policy(MIXED_POLICY))
    rng = np.random.default_rng(1)
    x, ids, z = mixed_inputs(rng)
    x[2, 1] = value
    fault = fault_of(model, x, ids, z)
    assert (fault.return_code, fault.tensor, fault.index, fault.fault) == (abi.ERR_INPUT_NONFINITE, "x", 9,
                                                                          "input_box")
    assert fault.mode == "degraded"
    x, ids, z = mixed_inputs(rng)
    z[4] = value  # z has no box: it is only checked finite
    fault = fault_of(model, x, ids, z)
    assert (fault.return_code, fault.tensor, fault.index) == (abi.ERR_INPUT_NONFINITE, "z", 4)
    z[4] = 1e300  # any finite value passes
    model(x, ids, z)


def test_the_first_failing_input_decides_the_code():
    model = compile(mixed_module(), failsafe=make_policy(MIXED_POLICY))
    x, ids, z = mixed_inputs(np.random.default_rng(2))
    x[0, 0], z[0] = 1.5, np.nan
    assert (fault_of(model, x, ids, z).return_code, fault_of(model, x, ids, z).tensor) == (abi.ERR_INPUT_BOX, "x")
    x[0, 0], x[1, 1] = 1.5, np.nan  # one NaN makes the boxed input's failure a non-finite one
    assert fault_of(model, x, ids, z).return_code == abi.ERR_INPUT_NONFINITE


def test_an_integer_box_stops_an_index_before_the_gather_reads_it():
    module = mixed_module()
    x, _, z = mixed_inputs(np.random.default_rng(3))
    with pytest.raises(RuntimeEvalError):
        compile(module)(x, np.array([3, 0], np.int64), z)  # unguarded: the gather's own index check
    model = compile(module, failsafe=make_policy(MIXED_POLICY))
    for ids, ok in (([0, 2], True), ([3, 0], False), ([-1, 0], False), ([2, 2], True)):
        _, fault = model.run_guarded(x, np.array(ids, np.int64), z)
        assert (fault is None) == ok, ids
        if not ok:
            assert fault is not None and (fault.return_code, fault.tensor) == (abi.ERR_INPUT_BOX, "ids")


def test_an_output_that_overflows_raises_the_output_fault():
    model = compile(exp_module(), failsafe=make_policy({"x": [-100.0, 100.0]}))
    x = np.full((2, 3), 10.0, np.float32)
    np.testing.assert_allclose(model(x), np.exp(x), rtol=1e-6)
    x[1, 0] = 89.0  # in the box, but exp(89) is above float32's largest value
    fault = fault_of(model, x)
    assert (fault.return_code, fault.fault, fault.mode, fault.parameters) == (abi.ERR_OUTPUT_NONFINITE, "output_nan",
                                                                              "stop", {"cap": 0.0})
    assert (fault.tensor, fault.index) == ("y", 3)


def test_a_nan_made_inside_the_model_is_an_output_fault():
    b = Builder()
    x = b.param("x", DType.f32, [4])
    model = compile(b.module(b.function("root", [x], [b.sqrt(x)], ["y"])), failsafe=make_policy({"x": [-1, 1]}))
    np.testing.assert_allclose(model(np.array([0, 0.25, 1, 0.5], np.float32)), [0, 0.5, 1, math.sqrt(0.5)])
    fault = fault_of(model, np.array([0, 0.25, -0.5, 1], np.float32))
    assert (fault.return_code, fault.tensor, fault.index) == (abi.ERR_OUTPUT_NONFINITE, "y", 2)


def test_fault_without_a_name_or_a_scenario_in_the_policy():
    table = [{"scenario": "none", "faults": [], "mode": "nominal", "parameters": {}, "verdict": "proved"}]
    model = compile(affine_module(), failsafe=make_policy(table=table))
    fault = fault_of(model, np.full((3, 4), 2.0, np.float32))
    assert (fault.fault, fault.mode, fault.parameters) == ("input_box", None, None)
    assert "no scenario" in str(fault) and "do not use the outputs" in str(fault)
    model = compile(affine_module(), failsafe=make_policy(input_fault=None, output_fault=None))
    fault = fault_of(model, np.full((3, 4), 2.0, np.float32))
    assert (fault.return_code, fault.fault, fault.mode) == (abi.ERR_INPUT_BOX, None, None)
    assert "names no fault" in str(fault)


def test_run_guarded_returns_what_a_call_returns_and_still_raises_other_errors():
    model = compile(mixed_module(), failsafe=make_policy(MIXED_POLICY))
    x, ids, z = mixed_inputs(np.random.default_rng(4))
    out, fault = model.run_guarded(x=x, ids=ids, z=z)
    assert fault is None and isinstance(out, tuple) and len(out) == 2
    np.testing.assert_array_equal(out[1], z + z)
    with pytest.raises(InputError):
        model.run_guarded(x[:2], ids, z)  # a shape the library was not compiled for


# --------------------------------------------------------------------------------------
# exact bounds per element type


def _values_near(dt: DType, targets: tuple[float, ...]) -> list[Any]:
    """Values of ``dt`` around each target: the three nearest below and above (every value of the type
    for types of 16 bits or fewer)."""
    if dt.is_float and dt.bits <= 16:
        bits = np.arange(1 << dt.bits, dtype=np.uint16 if dt.bits == 16 else np.uint8)
        with np.errstate(invalid="ignore"):
            every = bits.view(dt.np).astype(np.float64)
        pool = np.unique(every[np.isfinite(every)])
    elif dt.is_float:
        ft = dt.np.type
        pool = np.unique([float(v) for t in targets for v in _float_walk(ft(t), ft)])
    else:
        pool = np.array(sorted({v for t in targets for v in range(math.floor(t) - 3, math.ceil(t) + 4)
                                if dt.min_value <= v <= dt.max_value}), dtype=object)
    picked = set()
    for t in targets:
        at = int(np.searchsorted(pool.astype(np.float64), t))
        picked.update(pool[max(at - 3, 0):at + 3].tolist())
    return sorted(picked)


def _float_walk(v: Any, ft: Any) -> list[Any]:
    out = [v]
    for direction in (np.inf, -np.inf):
        w = v
        for _ in range(3):
            w = np.nextafter(w, ft(direction))
            out.append(w)
    return out


@pytest.mark.parametrize("dt", [DType.f32, DType.f64, DType.f16, DType.bf16, DType.f8e4m3fn, DType.i32,
                                DType.u8, DType.i64, DType.u64, DType.i4])
def test_box_bounds_are_exact_for_every_element_type(dt):
    lo, hi = -2.3, 0.1  # neither is a binary fraction: the type's nearest values decide
    b = Builder()
    x = b.param("x", dt, [3])
    y = b.op("cast", x, to=DType.f64)
    model = compile(b.module(b.function("edge", [x], [y], ["y"])), failsafe=make_policy({"x": [lo, hi]}))
    checked = 0
    for v in _values_near(dt, (lo, hi)):
        inside = Fraction(lo) <= Fraction(v) <= Fraction(hi)
        arr = np.zeros(3, dt.np)
        arr[1] = v
        _, fault = model.run_guarded(arr)
        assert (fault is None) == inside, (dt, v)
        if fault is not None:
            assert (fault.return_code, fault.index) == (abi.ERR_INPUT_BOX, 1)
        checked += 1
    assert checked >= 4  # an unsigned type has no values below 0


@pytest.mark.parametrize("dt,box", [(DType.f32, [0.1, 0.1]), (DType.i32, [0.2, 0.8]), (DType.f16, [1e5, 2e5]),
                                    (DType.u8, [256, 300])])
def test_a_box_no_value_of_the_type_lies_in_refuses_every_input(dt, box):
    b = Builder()
    x = b.param("x", dt, [2])
    model = compile(b.module(b.function("empty", [x], [b.op("cast", x, to=DType.f64)], ["y"])),
                    failsafe=make_policy({"x": box}))
    nearest = [dt.np.type(box[0]) if dt.is_float and box[0] <= dt.max_value else dt.max_value, 0, dt.min_value]
    for v in nearest:
        assert fault_of(model, np.full(2, v, dt.np)).return_code == abi.ERR_INPUT_BOX, v


def test_a_box_wider_than_the_type_passes_every_finite_value():
    b = Builder()
    x = b.param("x", DType.f16, [4])
    model = compile(b.module(b.function("wide", [x], [b.op("cast", x, to=DType.f32)], ["y"])),
                    failsafe=make_policy({"x": [-1e6, 1e6]}))
    big = float(ml_dtypes.finfo(np.float16).max)
    model(np.array([-big, big, 0, 1], np.float16))
    assert fault_of(model, np.array([0, np.inf, 0, 0], np.float16)).return_code == abi.ERR_INPUT_NONFINITE


# --------------------------------------------------------------------------------------
# the C ABI


def _tensor(a: np.ndarray, keep: list[Any], shape: tuple[int, ...] | None = None) -> CTensor:
    dims = (ctypes.c_int64 * max(a.ndim, 1))(*(shape or a.shape))
    keep.append(dims)
    return CTensor(a.ctypes.data, ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64)), a.ndim,
                   abi.DTYPE_CODES[DType.from_numpy(a.dtype)])


def test_c_abi_codes_and_fault_names_through_ctypes(tmp_path):
    model = compile(exp_module(), output_dir=tmp_path, failsafe=make_policy({"x": [-100.0, 100.0]}))
    manifest = model.manifest
    assert manifest is not None and model.library_path is not None
    lib = ctypes.CDLL(str(model.library_path))
    p = manifest["symbol_prefix"]
    run_checked, run, create = (getattr(lib, f"{p}_{n}") for n in ("run_checked", "run", "create"))
    run_checked.restype = run.restype = ctypes.c_int32
    run_checked.argtypes = [ctypes.c_void_p, ctypes.POINTER(CTensor), ctypes.c_int64, ctypes.POINTER(CTensor),
                            ctypes.c_int64]
    run.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p)]
    create.restype = ctypes.c_void_p
    fault_name = getattr(lib, manifest["guard"]["symbol"])
    fault_name.restype, fault_name.argtypes = ctypes.c_char_p, [ctypes.c_int32]
    ctx = create()
    keep: list[Any] = []
    y = np.full((2, 3), 7.0, np.float32)

    def checked(x: np.ndarray, shape: tuple[int, ...] | None = None) -> int:
        return run_checked(ctx, (CTensor * 1)(_tensor(x, keep, shape)), 1, (CTensor * 1)(_tensor(y, keep)), 1)

    def plain(x: np.ndarray) -> int:
        return run(ctx, (ctypes.c_void_p * 1)(x.ctypes.data), (ctypes.c_void_p * 1)(y.ctypes.data))

    ok = np.zeros((2, 3), np.float32)
    assert checked(ok) == abi.OK and plain(ok) == abi.OK
    np.testing.assert_array_equal(y, 1.0)
    for value, code in ((150.0, abi.ERR_INPUT_BOX), (np.nan, abi.ERR_INPUT_NONFINITE),
                        (-np.inf, abi.ERR_INPUT_NONFINITE), (95.0, abi.ERR_OUTPUT_NONFINITE)):
        x = ok.copy()
        x[1, 1] = value
        assert checked(x) == code and plain(x) == code, value
    y[:] = 7.0
    bad = ok.copy()
    bad[0, 0] = 150.0
    assert checked(bad, shape=(3, 2)) == abi.ERR_SHAPE  # the shape check comes first, as before
    assert checked(bad) == abi.ERR_INPUT_BOX
    np.testing.assert_array_equal(y, 7.0)  # an input fault writes no output
    names = {c: fault_name(c) for c in range(-1, 12)}
    assert names[abi.ERR_INPUT_BOX] == names[abi.ERR_INPUT_NONFINITE] == b"input_box"
    assert names[abi.ERR_OUTPUT_NONFINITE] == b"output_nan"
    assert all(v is None for c, v in names.items() if c not in abi.GUARD_CODES)
    header = (tmp_path / manifest["header"]).read_text()
    assert f"const char* {p}_guard_fault(int32_t code);" in header and f"#define {p.upper()}_GUARDED 1" in header
    assert "#define CUVIL_ERR_INPUT_BOX 7" in header and "#define CUVIL_ERR_OUTPUT_NONFINITE 9" in header
    assert "input 0 x: every element in [-100.0, 100.0]" in header


def test_an_unguarded_library_has_no_fault_symbol_and_lets_values_through(tmp_path):
    model = compile(exp_module(), output_dir=tmp_path)
    manifest = model.manifest
    assert manifest is not None and "guard" not in manifest and "failsafe" not in manifest
    lib = ctypes.CDLL(str(model.library_path))
    with pytest.raises(AttributeError):
        _ = lib[f"{manifest['symbol_prefix']}_guard_fault"]
    assert "_guard_fault" not in (tmp_path / manifest["header"]).read_text()
    assert np.isinf(model(np.full((2, 3), 95.0, np.float32))).all()


C_PROGRAM = r"""
#include <stdio.h>
#include <math.h>
#include "cuvil_expo.h"

int main(void) {
    float x[6] = {0, 1, 2, 3, 4, 5}, y[6];
    int64_t shape[2] = {2, 3};
    cuvil_tensor in = {x, shape, 2, CUVIL_DTYPE_F32}, out = {y, shape, 2, CUVIL_DTYPE_F32};
    void* ctx = cuvil_expo_create();
    int ok = cuvil_expo_run_checked(ctx, &in, 1, &out, 1);
    x[4] = NAN;
    int rc = cuvil_expo_run_checked(ctx, &in, 1, &out, 1);
    const char* name = cuvil_expo_guard_fault(rc);
    printf("%d %d %s %d\n", ok, rc, name ? name : "(null)", CUVIL_EXPO_GUARDED);
    cuvil_expo_destroy(ctx);
    return rc == CUVIL_ERR_INPUT_NONFINITE ? 0 : 1;
}
"""


@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_a_c_program_reads_the_fault_through_the_header(tmp_path):
    model = compile(exp_module(), output_dir=tmp_path / "lib", failsafe=make_policy({"x": [-50, 50]}))
    assert model.library_path is not None and CC is not None
    exe = tmp_path / "consumer"
    build = subprocess.run([CC, "-std=c11", "-Wall", "-Werror", "-I", str(tmp_path / "lib"), "-o", str(exe), "-x", "c",
                            "-", "-x", "none", str(model.library_path), f"-Wl,-rpath,{model.library_path.parent}",
                            "-lm"],
                           input=C_PROGRAM, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    res = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.split() == ["0", str(abi.ERR_INPUT_NONFINITE), "input_box", "1"]


# --------------------------------------------------------------------------------------
# manifest and cache


def test_the_manifest_records_the_policy_and_the_checks(tmp_path):
    doc = make_policy(MIXED_POLICY)
    model = compile(mixed_module(), output_dir=tmp_path, failsafe=doc)
    m = model.manifest
    assert m is not None
    fs = m["failsafe"]
    assert fs["policy_digest"] == doc["digest"] and fs["format"] == FORMAT
    written = Policy.from_json(doc).to_dict()["table"]  # each row as the policy writer writes it
    assert fs["spec"] == doc["spec"] and fs["table"] == written and fs["modes"] == doc["modes"]
    assert [{k: row[k] for k in given} for row, given in zip(fs["table"], doc["table"], strict=True)] == doc["table"]
    assert fs["guard"] == doc["guard"]
    assert m["guard"]["input_fault"] == "input_box" and m["guard"]["output_fault"] == "output_nan"
    assert m["guard"]["checks"] == [
        {"side": "input", "tensor": "x", "index": 0, "check": "box", "lo": -1.0, "hi": 1.0,
         "element_bounds": [-1.0, 1.0]},
        {"side": "input", "tensor": "ids", "index": 1, "check": "box", "lo": 0.0, "hi": 2.0, "element_bounds": [0, 2]},
        {"side": "input", "tensor": "z", "index": 2, "check": "finite"},
        {"side": "output", "tensor": "y", "index": 0, "check": "finite"},
        {"side": "output", "tensor": "w", "index": 1, "check": "finite"},
    ]
    assert {m["error_codes"][abi.ERROR_NAMES[c]] for c in abi.GUARD_CODES} == set(abi.GUARD_CODES)
    manifest_path = tmp_path / f"{m['symbol_prefix']}.json"
    assert json.loads(manifest_path.read_text())["failsafe"] == fs
    assert load(model.library_path).manifest == m  # type: ignore[arg-type]
    edited = json.loads(manifest_path.read_text())
    edited["failsafe"]["table"][1]["mode"] = "nominal"  # the policy's table is sealed with the library
    manifest_path.write_text(json.dumps(edited))
    with pytest.raises(IntegrityError):
        load(model.library_path)  # type: ignore[arg-type]


def test_the_cache_key_includes_the_policy_digest():
    module = affine_module()
    first = compile(module, failsafe=make_policy())
    assert first.cache_info["cache"] == "miss"
    again = compile(module, failsafe=make_policy())
    assert again.cache_info["cache"] == "hit" and again.cache_info["key"] == first.cache_info["key"]
    other = compile(module, failsafe=make_policy({"x": [-2.0, 2.0]}))
    plain = compile(module)
    keys = {first.cache_info["key"], other.cache_info["key"], plain.cache_info["key"]}
    assert len(keys) == 3 and other.cache_info["cache"] == plain.cache_info["cache"] == "miss"
    x = np.full((3, 4), 1.5, np.float32)
    assert other.run_guarded(x)[1] is None and first.run_guarded(x)[1] is not None
    assert "failsafe" not in (plain.manifest or {})


def test_a_dynamic_model_guards_every_specialization():
    b = Builder()
    x = b.param("x", DType.f32, [sym("N"), 4])
    module = b.module(b.function("dyn", [x], [b.tanh(x)], ["y"]))
    model = compile(module, failsafe=make_policy())
    assert model.is_dynamic
    for rows in (2, 5):
        x_ok = np.zeros((rows, 4), np.float32)
        np.testing.assert_array_equal(model(x_ok), 0.0)
        x_bad = x_ok.copy()
        x_bad[-1, -1] = -3.0
        fault = fault_of(model, x_bad)
        assert (fault.return_code, fault.index) == (abi.ERR_INPUT_BOX, rows * 4 - 1)
    assert len(model.specializations) == 2


# --------------------------------------------------------------------------------------
# malformed policies


def _mutate(path: str, value: Any, *, keep_digest: bool = False):
    def apply(doc: dict[str, Any]) -> dict[str, Any]:
        *parents, last = path.split("/")
        node: Any = doc
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is _DELETE:
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
        return doc if keep_digest else redigest(doc)
    return apply


_DELETE = object()

MALFORMED = {
    "format": (_mutate("format", "cuvil-failsafe-policy/2"), "format"),
    "missing guard": (_mutate("guard", _DELETE), "$: missing field 'guard'"),
    "unknown field": (_mutate("extra", 1), "unknown fields extra"),
    "edited content": (_mutate("guard/inputs/x", [-5.0, 5.0], keep_digest=True), "digest"),
    "digest not hex": (_mutate("digest", "xyz", keep_digest=True), "digest"),
    "lo above hi": (_mutate("guard/inputs/x", [1.0, -1.0]), "$.guard.inputs.x: expected [lo, hi] with lo <= hi"),
    "bound as text": (_mutate("guard/inputs/x", ["-1", 1.0]), "$.guard.inputs.x[0]: expected a number"),
    "bound as bool": (_mutate("guard/inputs/x", [False, 1.0]), "$.guard.inputs.x[0]: expected a number"),
    "infinite bound": (_mutate("guard/inputs/x", [-1.0, math.inf], keep_digest=True),
                       "$.guard.inputs.x[1]: numbers must be finite"),
    "nan elsewhere": (_mutate("table/0/counterexamples", [{"state": {"speed": math.nan}}], keep_digest=True),
                      "$.table[0].counterexamples[0].state.speed: numbers must be finite"),
    "three bounds": (_mutate("guard/inputs/x", [-1.0, 0.0, 1.0]), "$.guard.inputs.x: expected a pair [lo, hi]"),
    "box not a list": (_mutate("guard/inputs/x", {"lo": -1, "hi": 1}), "$.guard.inputs.x: expected a list"),
    "guard field unknown": (_mutate("guard/outputs", {}), "unknown fields outputs"),
    "undeclared input fault": (_mutate("guard/input_fault", "nope"), "guard.input_fault"),
    "input fault of the wrong kind": (_mutate("guard/input_fault", "output_nan"), "kind 'input-box'"),
    "output fault of the wrong kind": (_mutate("guard/output_fault", "sensor_lost"), "kind 'non-finite'"),
    "fault name not a name": (_mutate("faults/0/name", "sensor lost"), "faults[0].name"),
    "fault kind unknown": (_mutate("faults/0/kind", "cosmic-ray"), "faults[0].kind"),
    "fault declared twice": (_mutate("faults/0/name", "input_box"), "declared twice"),
    "no modes": (_mutate("modes", []), "$.modes: expected at least one mode"),
    "mode twice": (_mutate("modes", ["a", "a"]), "$.modes[1]: 'a' is declared twice"),
    "row with an unknown mode": (_mutate("table/1/mode", "warp"), "table[1].mode"),
    "row label mismatch": (_mutate("table/1/scenario", "output_nan"), "table[1].scenario"),
    "row with an undeclared fault": (_mutate("table/1/faults", ["gremlin"]), "table[1].faults"),
    "row parameter not a number": (_mutate("table/1/parameters/cap", "fast"), "table[1].parameters.cap"),
    "row without verdict": (_mutate("table/1/verdict", _DELETE), "$.table[1]: missing field 'verdict'"),
    "scenario twice": (_mutate("table/2", {"scenario": "input_box", "faults": ["input_box"], "mode": "stop",
                                            "parameters": {}, "verdict": "proved"}), "two rows"),
    "negative seconds": (_mutate("table/0/seconds", -1.0), "table[0].seconds"),
    "state interval empty": (_mutate("state/speed/lo", 50), "state.speed"),
    "spec digest not hex": (_mutate("spec/digest", "abc"), "spec.digest"),
    "unrealizable label mismatch": (_mutate("unrealizable/0/scenario", "all"), "unrealizable[0].scenario"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_policies_are_refused_naming_the_field(case):
    mutate, fragment = MALFORMED[case]
    doc = mutate(copy.deepcopy(make_policy()))
    with pytest.raises(PolicyError) as info:
        GuardSpec.from_policy(doc)
    assert info.value.code == "CUVIL-FAILSAFE-POLICY"
    assert info.value.message.startswith("$") and fragment in info.value.message, info.value.message
    with pytest.raises(PolicyError) as same:  # one reader: the policy module refuses it with the same words
        Policy.from_json(doc)
    assert same.value.message == info.value.message


@pytest.mark.parametrize("content,fragment", [
    (b'{"format": NaN}', "NaN"),
    (b'{"format": "a", "format": "b"}', "twice"),
    (b'{"format": ', "not JSON"),
    (b"[1, 2]", "expected an object"),
    (b'{"format": "caf\xe9"}', "not UTF-8 text"),
    ('\ufeff{"format": 1}'.encode(), "not JSON: Unexpected UTF-8 BOM"),
    (b"[" * 100_000, "nested too deeply"),
])
def test_policy_files_are_read_as_strict_utf8_json(tmp_path, content, fragment):
    path = tmp_path / "policy.json"
    path.write_bytes(content)
    with pytest.raises(PolicyError) as info:
        read_policy(path)
    assert fragment in info.value.message and info.value.location == f"{path} $"


HOSTILE = {
    "tuple in a mapping": (lambda d: d["table"][0]["parameters"].update(cap=(1.0,)),
                           "$.table[0].parameters.cap: expected JSON data, found tuple"),
    "key not a string": (lambda d: d["state"].update({1: {"lo": 0, "hi": 1}}), "$.state: the key 1 is not a string"),
    "infinity in a field no one reads": (lambda d: d["table"][0].update(note=math.inf),
                                         "$.table[0].note: numbers must be finite"),
    "fault name too long": (lambda d: d["faults"][0].update(name="f" * 129), "$.faults[0].name: 'fff"),
    "nul in a mode": (lambda d: d["modes"].__setitem__(0, "no\0minal"), "$.modes[0]: 'no\\x00minal' contains a NUL"),
    "a row's fault twice": (lambda d: d["table"][1].update(faults=["input_box", "input_box"]),
                            "$.table[1].faults[1]: 'input_box' is given twice"),
    "negative seconds elsewhere": (lambda d: d["unrealizable"][0].update(seconds=-1.0),
                                   "$.unrealizable[0].seconds: expected a duration"),
    "guard fault undeclared": (lambda d: d["guard"].update(output_fault="ghost"), "(it is not declared)"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_documents_are_refused_by_path_before_the_digest(case):
    change, fragment = HOSTILE[case]
    doc = make_policy()
    change(doc)  # the digest is left as it was: every check comes before it
    for read in (GuardSpec.from_policy, Policy.from_json):
        with pytest.raises(PolicyError) as info:
            read(doc)
        assert fragment in info.value.message, info.value.message


def test_a_policy_object_gives_the_guard_of_the_file_it_writes(tmp_path):
    doc = make_policy(MIXED_POLICY)
    policy = Policy.from_json(doc)
    assert policy.digest == doc["digest"] and Policy.from_json(doc, check_digest=False).digest == ""
    path = tmp_path / "policy.json"
    path.write_text(policy.to_json())
    from_object, from_file = read_policy(policy), read_policy(path)
    assert from_object == from_file and from_object.digest == json.loads(path.read_text())["digest"]
    assert from_object.boxes == (("x", -1.0, 1.0), ("ids", 0.0, 2.0)) and from_file.where == str(path)
    assert read_policy(copy.deepcopy(doc)).digest == doc["digest"]  # the document's own digest, not a rewrite's
    with pytest.raises(PolicyError) as info:  # a Policy made in memory is read like a file
        read_policy(dataclasses.replace(policy, modes=()))
    assert info.value.message.startswith("$.modes: expected at least one mode")


def test_a_policy_file_round_trips_and_bad_sources_are_refused(tmp_path):
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(make_policy(MIXED_POLICY), indent=2))
    spec = read_policy(path)
    assert spec.boxes == (("x", -1.0, 1.0), ("ids", 0.0, 2.0)) and spec.response("input_box") == (
        "degraded", {"cap": 10.0})
    assert spec.response("sensor_lost") == (None, None)
    with pytest.raises(FileAccessError):
        read_policy(tmp_path / "missing.json")
    with pytest.raises(PolicyError):
        read_policy(42)  # type: ignore[arg-type]


def test_a_box_for_an_input_the_model_lacks_is_refused_by_name(tmp_path):
    with pytest.raises(PolicyError) as info:
        compile(affine_module(), failsafe=make_policy({"x": [-1, 1], "speed": [0, 30]}))
    assert "'speed'" in info.value.message and "'x'" in (info.value.hint or "")
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(make_policy({"speed": [0, 30]})))
    with pytest.raises(PolicyError) as info:
        compile(affine_module(), failsafe=path)
    assert "'speed'" in info.value.message and info.value.location == str(path)
    b = Builder()
    flag = b.param("flag", DType.bool, [2])
    module = b.module(b.function("flags", [flag], [b.op("cast", flag, to=DType.f32)], ["y"]))
    with pytest.raises(CodegenError, match="bool"):
        compile(module, failsafe=make_policy({"flag": [0, 1]}))


# --------------------------------------------------------------------------------------
# the command line


def test_cuvil_compile_failsafe_writes_a_guarded_library(tmp_path, capsys):
    model = export_ir(exp_module(), tmp_path / "expo.cir")
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(make_policy({"x": [-50, 50]})))
    lib = tmp_path / "out" / "libexpo.so"
    assert main(["compile", str(model), "-o", str(lib), "--failsafe", str(policy)]) == 0
    printed = capsys.readouterr().out
    assert "guard" in printed and "input x in [-50.0, 50.0]" in printed and "input_box" in printed
    manifest = json.loads((tmp_path / "out" / "expo.json").read_text())
    assert manifest["failsafe"]["policy_digest"] == json.loads(policy.read_text())["digest"]
    assert "_guard_fault(int32_t code);" in (tmp_path / "out" / "expo.h").read_text()
    fault = fault_of(load(lib), np.full((2, 3), 60.0, np.float32))
    assert (fault.return_code, fault.mode) == (abi.ERR_INPUT_BOX, "degraded")

    policy.write_text(json.dumps(make_policy({"x": [50, -50]})))
    assert main(["compile", str(model), "-o", str(tmp_path / "libbad.so"), "--failsafe", str(policy)]) == 2
    assert "CUVIL-FAILSAFE-POLICY" in capsys.readouterr().err and not (tmp_path / "libbad.so").exists()
