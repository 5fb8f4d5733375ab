"""The .cir text format: lossless round trips, exact constants, readable output, located errors."""

import json
import math
import re

import ml_dtypes
import numpy as np
import pytest

from cuvil.errors import IRError, ParseError
from cuvil.interp import run_reference
from cuvil.ir import Builder, DType, sym
from cuvil.ir.module import content_hash
from cuvil.ir.opdef import all_ops
from cuvil.ir.parser import load_ir, parse_module
from cuvil.ir.printer import LITERAL_MAX_ELEMENTS, export_ir, format_dim, print_module
from cuvil.ir.symbolic import parse_dim, sym_max, sym_min
from cuvil.ir.types import DimConstraint, TensorType


def assert_round_trip(m):
    text = print_module(m)
    back = parse_module(text)
    assert back == m
    for a, b in zip(back.functions, m.functions, strict=True):
        assert a is not None and a.results == b.results  # hash-consing: the very same values
        assert all(x is y for x, y in zip(a.results, b.results, strict=True))
        assert a.constraints == b.constraints and a.result_names == b.result_names
    assert dict(back.metadata) == dict(m.metadata)
    for k, arr in m.constants.items():
        got = back.constants[k]
        assert got.dtype == arr.dtype and got.shape == arr.shape
        assert got.tobytes() == arr.tobytes(), k
    assert print_module(back) == text  # printing is a function of the module
    return text


# --------------------------------------------------------------------------------------
# round trips


def test_mlp_prints_readably_and_round_trips():
    b = Builder()
    n = sym("N")
    x = b.param("x", DType.f32, [n, 8])
    w = b.const(np.random.default_rng(0).standard_normal((6, 8)).astype(np.float32))
    bias = b.const(np.array([1.0, 2.0, 3.5, -0.0, 0.25, -1.0], dtype=np.float32))
    h = b.relu(b.add(b.matmul(x, w, transpose_b=True), bias))
    fn = b.function("main", [x], [h], ["logits"], [DimConstraint("N", 1, 64, 8)])
    m = b.module(fn, metadata={"source": "test", "note": 'quote " and \\ backslash'})
    text = assert_round_trip(m)
    assert "func @main(%x: f32[N, 8]) -> (%logits: f32[N, 6]) where 1 <= N <= 64, N % 8 == 0 {" in text
    assert f"const @{bias.const_hash} : f32[6] = [1.0, 2.0, 3.5, -0.0, 0.25, -1.0]" in text
    assert re.search(r"const @k[0-9a-f]{20} : f32\[6, 8\] = base64\"", text)
    # defaults are left out, set attributes shown
    assert re.search(r"= matmul\(%x, @k[0-9a-f]{20}\) \{transpose_b = true\} : f32\[N, 6\]", text)
    assert "transpose_a" not in text
    assert text.rstrip().endswith("return %2\n  }\n}".rstrip())


@pytest.mark.parametrize("dtype", list(DType), ids=str)
def test_every_dtype_round_trips_as_literal_and_base64(dtype):
    rng = np.random.default_rng(1)
    if dtype is DType.bool:
        small, big = rng.random(5) < 0.5, rng.random((5, 7)) < 0.5
    elif dtype.is_float:
        small = rng.standard_normal(5).astype(dtype.np)
        big = rng.standard_normal((5, 7)).astype(dtype.np)
    else:
        lo, hi = dtype.min_value, dtype.max_value
        small = np.array([lo, hi, 0, 1, hi - 1], dtype=object).astype(np.int64 if hi < 2**63 else np.uint64)
        small = small.astype(dtype.np)
        big = rng.integers(lo, hi, size=(5, 7), dtype=np.int64 if hi < 2**63 else np.uint64,
                           endpoint=True).astype(dtype.np)
    b = Builder()
    p = b.param("p", dtype, [5])
    ks, kb = b.const(small), b.const(big)
    m = b.module(b.function("main", [p], [ks, kb, p], ["s", "b", "p"]))
    text = assert_round_trip(m)
    assert f"@{ks.const_hash} : {dtype}[5] = [" in text
    assert f"@{kb.const_hash} : {dtype}[5, 7] = base64\"" in text


@pytest.mark.parametrize("dtype", [DType.f64, DType.f32, DType.f16, DType.bf16], ids=str)
def test_float_literals_are_bit_exact(dtype):
    """Every bit pattern except NaN payloads prints as a literal and reads back bit for bit."""
    rng = np.random.default_rng(2)
    width = dtype.np.itemsize
    raw = rng.integers(0, 256, size=(LITERAL_MAX_ELEMENTS * width,), dtype=np.uint8)
    vals = raw.view(dtype.np).copy()
    vals[np.isnan(vals.astype(np.float64))] = 0
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.5, 1e-3], dtype=np.float64).astype(dtype.np)
    info = ml_dtypes.finfo(dtype.np)
    tiny = np.array([info.smallest_subnormal, info.max, info.tiny, -info.max], dtype=dtype.np)
    for arr in (vals, specials, tiny):
        b = Builder()
        k = b.const(arr)
        m = b.module(b.function("main", [], [k]))
        text = assert_round_trip(m)
        assert "base64" not in text


def test_nan_payloads_fall_back_to_base64_and_stay_exact():
    payload = np.array([0x7FC00001, 0xFFC00000, 0x3F800000], dtype=np.uint32).view(np.float32)
    b = Builder()
    k = b.const(payload)
    m = b.module(b.function("main", [], [k]))
    text = assert_round_trip(m)
    assert "base64" in text


def test_symbolic_dims_with_floor_div_and_mod_round_trip():
    n, h = sym("N"), sym("H")
    dims = [3 * (n // 2), -(n // 2), (h - 3) // 2 + 1, n * (h // 2), (n // 2) * (h // 3), n % 8 + h,
            sym_max(n, 3) * 2, sym_min(n, h) - 1, 2 * n * h + 1, -n + 4, 5 // n]
    for d in dims:
        assert parse_dim(format_dim(d)) == d, format_dim(d)
    b = Builder()
    x = b.param("x", DType.f32, [n, h])
    y = b.reshape(x, shape=[n * h])
    z = b.op("reshape", y, shape=[h, n])
    m = b.module(b.function("main", [x], [y, z], ["flat", "back"]))
    assert_round_trip(m)
    # every dim expression above survives as a type dim and as a dims attribute
    for d in dims:
        t = format_dim(d)
        text = (f"module {{\n  func @main(%x: f32[N, H]) -> (%y: f32[{t}]) {{\n"
                f"    %0 = reshape(%x) {{shape = [{t}, 1]}} : f32[{t}]\n    return %0\n  }}\n}}\n")
        back = parse_module(text, verify=False)
        (y,) = back.main.results
        assert y.type.shape == (d,), t
        assert y.attr("shape") == (d, 1), t


def test_every_catalogue_example_round_trips():
    count = 0
    for op in all_ops():
        for arrays, attrs in op.examples(np.random.default_rng(0)):
            b = Builder()
            params = [b.param(f"in{i}", DType.from_numpy(a.dtype), a.shape) for i, a in enumerate(arrays)]
            v = b.op(op.name, *params, **attrs)
            consts = [b.const(a) for a in arrays]
            w = b.op(op.name, *consts, **attrs)
            m = b.module(b.function("main", params, [v, w], ["from_params", "from_consts"]))
            assert_round_trip(m)
            count += 1
    assert count >= len(all_ops())


def test_attribute_kinds_stay_distinct():
    """1, 1.0, True, "1", f16 and N are different attribute values and print differently."""
    from cuvil.ir.printer import format_attr

    texts = [format_attr(v) for v in (1, 1.0, True, "1", DType.f16, sym("N"), None, -0.0, 0.0,
                                       float("inf"), float("-inf"), float("nan"), 1e-5, (1, 2), ())]
    assert texts == ["1", "1.0", "true", '"1"', "f16", "N", "none", "-0.0", "0.0", "inf", "-inf", "nan",
                     "1e-05", "[1, 2]", "[]"]
    from cuvil.ir.parser import _Parser

    for v, t in zip((1, 1.0, True, "1", DType.f16, sym("N"), None, -0.0, float("inf"), float("-inf"), 1e-5),
                    ("1", "1.0", "true", '"1"', "f16", "N", "none", "-0.0", "inf", "-inf", "1e-05"), strict=True):
        got = _Parser(t, None).attr_value()
        assert type(got) is type(v) and got == v, t
        if isinstance(v, float):
            assert math.copysign(1.0, got) == math.copysign(1.0, v)
    # a symbol spelled like a keyword is parenthesized so it stays a dim
    assert format_attr(sym("f16") + 1) == "(f16 + 1)"
    assert _Parser("(f16 + 1)", None).attr_value() == sym("f16") + 1


def test_names_that_are_not_identifiers_are_quoted():
    b = Builder()
    x = b.param("input.1", DType.f32, [2])
    y = b.param("0", DType.f32, [2])  # would clash with the numbering of op values
    z = b.add(b.relu(x), y)
    m = b.module(b.function("main graph", [x, y], [z, x], ["out:0", "échappé"]))
    text = assert_round_trip(m)
    assert '%"input.1": f32[2]' in text
    assert '%"0": f32[2]' in text
    assert 'func @"main graph"(' in text
    assert f"%{json.dumps('out:0')}: f32[2]" in text


def test_several_functions_and_shared_constants():
    b = Builder()
    k = b.const(np.arange(4, dtype=np.int64))
    x = b.param("x", DType.i64, [4])
    f = b.function("main", [x], [b.add(x, k)])
    y = b.param("y", DType.i64, [4])
    g = b.function("other", [y], [b.op("mul", y, k) if "mul" in {o.name for o in all_ops()} else b.add(y, y), k])
    m = b.module(f, g)
    text = assert_round_trip(m)
    assert text.count("const @") == 1


def test_regions_round_trip():
    from cuvil.ir.region import Region

    b = Builder()
    t = TensorType(DType.f32, (2, 3))
    a0, a1 = Region.arg(0, t), Region.arg(1, TensorType(DType.f32, (3,)))
    body = Region((a0, a1), b.relu(b.add(a0, a1)))
    x = b.param("x", DType.f32, [2, 3])
    bias = b.const(np.ones(3, dtype=np.float32))
    y = b.fused(x, bias, body=body, kind="epilogue")
    m = b.module(b.function("main", [x], [y]))
    text = assert_round_trip(m)
    assert "body = region(%arg0: f32[2, 3], %arg1: f32[3]) {" in text
    assert "yield %1" in text


def test_export_and_load_file(tmp_path):
    b = Builder()
    x = b.param("x", DType.f16, [3])
    m = b.module(b.function("main", [x], [b.relu(x)]), metadata={"source": "test"})
    path = export_ir(m, tmp_path / "m.cir")
    assert path.read_text().startswith("module attributes {source = \"test\"} {")
    assert load_ir(path) == m
    assert [p.name for p in tmp_path.iterdir()] == ["m.cir"]  # no temporary left behind


# --------------------------------------------------------------------------------------
# hand-written text


HAND_WRITTEN = """
# a hand-written module: names, comments, friendly constant names
module {
  const @w : f32[2, 3] = [[1.0, -2.0, 0.5], [0.0, 3.0, -1.0]]
  const @b : f32[2] = [0.5, -0.5]
  func @main(%x: f32[N, 3]) -> (%y: f32[N, 2]) where N <= 16 {
    %h = matmul(%x, @w) {transpose_b = true} : f32[N, 2]   # x @ w.T
    %z = add(%h, @b) : f32[N, 2]
    %y = relu(%z) : f32[N, 2]
    return %y
  }
}
"""


def test_hand_written_text_parses_and_runs():
    m = parse_module(HAND_WRITTEN, filename="hand.cir")
    assert m.main.constraint("N") == DimConstraint("N", 1, 16)
    x = np.random.default_rng(3).standard_normal((5, 3)).astype(np.float32)
    (y,) = run_reference(m, [x])
    w = np.array([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0]], np.float32)
    np.testing.assert_allclose(y, np.maximum(x @ w.T + np.array([0.5, -0.5], np.float32), 0), rtol=1e-6)
    again = parse_module(print_module(m))
    assert again == m


def test_attribute_values_are_brought_to_their_declared_kind():
    text = HAND_WRITTEN.replace("{transpose_b = true}", "{transpose_b = 1}")
    m = parse_module(text)
    mm = next(v for v in m.main.values() if v.op == "matmul")
    assert mm.attr("transpose_b") is True


# --------------------------------------------------------------------------------------
# errors


def parse_error(text, fragment):
    with pytest.raises(ParseError) as e:
        parse_module(text, filename="bad.cir")
    err = e.value
    assert err.code == "CUVIL-PARSE"
    assert fragment in err.message, err.message
    assert re.fullmatch(r"bad\.cir:\d+:\d+", err.location), err.location
    assert err.hint
    return err


def test_error_points_at_line_column_and_token():
    err = parse_error(HAND_WRITTEN.replace("%z = add(%h, @b)", "%z = add(%h @b)"), "expected ',' or ')'")
    line = HAND_WRITTEN.splitlines().index("    %z = add(%h, @b) : f32[N, 2]") + 1
    assert err.location == f"bad.cir:{line}:17"
    assert "found '@'" in err.message


@pytest.mark.parametrize("old,new,fragment", [
    ("%y = relu(%z)", "%y = relu(%q)", "value %q is not defined"),
    ("%y = relu(%z)", "%y = frobnicate(%z)", "unknown op 'frobnicate'"),
    ("%y = relu(%z)", "%h = relu(%z)", "value %h is defined twice"),
    ("add(%h, @b)", "add(%h, @nope)", "constant @nope is not declared"),
    ("f32[2] = [0.5, -0.5]", "f32[2] = [0.5, -0.5, 1.0]", "this list has 3 entries"),
    ("f32[2] = [0.5, -0.5]", "f32[2] = [0.5, true]", "expected a number"),
    ("f32[2] = [0.5, -0.5]", 'f32[2] = base64"AAAA"', "has 3 bytes of data"),
    ("f32[2] = [0.5, -0.5]", "f33[2] = [0.5, -0.5]", "expected a tensor type"),
    ("-> (%y: f32[N, 2])", "-> (%y: f32[N, 3])", "result %y is declared f32[N, 3]"),
    ("-> (%y: f32[N, 2])", "-> (%y: f32[N, 2], %u: f32[N, 2])", "declares 2 results but returns 1"),
    ("{transpose_b = true}", "{transpose_b = true, transpose_b = false}", "given twice"),
    ("{transpose_b = true}", "{transposed = true}", "has no attribute 'transposed'"),
    ("where N <= 16", "where N % 0 == 0", "modulus 0 must be positive"),
    ("where N <= 16", "where N <= 16,", "expected a constraint"),
    ("# x @ w.T", "$", "unexpected character '$'"),
    ("return %y", "", "expected a value definition, `return` or `yield`"),
    ('const @b', 'const @"b', "unterminated or malformed string"),
    ("module {", "modul {", "expected 'module'"),
])
def test_parse_errors(old, new, fragment):
    assert old in HAND_WRITTEN
    parse_error(HAND_WRITTEN.replace(old, new, 1), fragment)


def test_trailing_text_and_integer_range_are_rejected():
    parse_error(HAND_WRITTEN + "\nmodule {}", "expected end of input")
    parse_error("module {\n  const @k : i8[2] = [1, 128]\n}", "128 is out of range for i8")
    parse_error("module {\n  const @k : f32[N] = [1.0]\n}", "has a symbolic shape")


def test_content_hash_names_are_checked_against_the_data():
    b = Builder()
    k = b.const(np.array([1.0, 2.0], dtype=np.float32))
    m = b.module(b.function("main", [], [k]))
    text = print_module(m).replace("[1.0, 2.0]", "[1.0, 3.0]")
    err = parse_error(text, "does not match its content hash")
    assert content_hash(np.array([1.0, 3.0], np.float32)) in err.message


def test_semantic_errors_are_located_in_the_file():
    text = HAND_WRITTEN.replace("%y = relu(%z) : f32[N, 2]", "%y = relu(%z) : f32[N, 2]").replace(
        "%z = add(%h, @b) : f32[N, 2]", "%z = add(%h, @b) : f32[N, 5]")
    text = text.replace("-> (%y: f32[N, 2])", "-> (%y: f32[N, 5])").replace(
        "%y = relu(%z) : f32[N, 2]", "%y = relu(%z) : f32[N, 5]")
    with pytest.raises(IRError) as e:
        parse_module(text, filename="sem.cir")
    line = text.splitlines().index("    %z = add(%h, @b) : f32[N, 5]") + 1
    assert e.value.location == f"sem.cir:{line}:6"
    assert "differs from f32[N, 2]" in e.value.message
    # without verification the same text is read as written, for inspecting broken IR
    m = parse_module(text, verify=False)
    assert m.main.results[0].type == TensorType(DType.f32, (sym("N"), 5))


def test_bf16_constant_literal_is_exact():
    arr = np.array([0.1, -3.0e38, 1.0e-40, 65504.0], dtype=ml_dtypes.bfloat16)
    b = Builder()
    k = b.const(arr)
    m = b.module(b.function("main", [], [k]))
    text = assert_round_trip(m)
    assert ": bf16[4] = [" in text


# --------------------------------------------------------------------------------------
# real models


def _importable(sources):
    """The modules of the sources that import today (more as converters land)."""
    from cuvil.errors import CuvilError
    from cuvil.frontend.onnx_import import import_onnx

    for src in sources:
        try:
            yield import_onnx(src)
        except CuvilError:
            continue


def test_every_importable_bench_model_round_trips():
    from pathlib import Path

    paths = sorted(Path(__file__).resolve().parents[2].glob("bench/**/*.onnx"))
    if not sum(1 for m in _importable(paths) if assert_round_trip(m)):
        pytest.skip("no bench model imports yet")


@pytest.mark.slow  # builds all ~1900 ONNX node-test models in memory first: ~5 s idle, a minute on busy cores
def test_every_importable_onnx_node_test_model_round_trips():
    import warnings

    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    count = sum(1 for m in _importable(c.model for c in cases) if assert_round_trip(m))
    assert count >= 500  # most of ONNX's node tests import already


def test_pathological_nesting_is_a_parse_error():
    text = "module {\n  func @main(%x: f32[" + "(" * 5000 + "N" + ")" * 5000 + "]) -> () {\n    return\n  }\n}\n"
    with pytest.raises(ParseError, match="nested too deeply"):
        parse_module(text)
    # the same shape, sanely nested, is fine (and a function may have no results)
    m = parse_module(text.replace("(" * 5000 + "N" + ")" * 5000, "((N))"))
    assert m.main.params[0].type.shape == (sym("N"),) and m.main.results == ()
