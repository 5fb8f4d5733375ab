"""Well-formedness: Builder output passes; values built directly around the Builder are caught."""

import numpy as np
import pytest

from cuvil.errors import IRError
from cuvil.ir import Builder, DType, sym
from cuvil.ir.module import Function, Module
from cuvil.ir.opdef import all_ops
from cuvil.ir.region import Region
from cuvil.ir.types import DimConstraint, TensorType
from cuvil.ir.values import Value, param
from cuvil.ir.wellformed import check_module

F32_23 = TensorType(DType.f32, (2, 3))


def broken(fragment, module, where=None):
    with pytest.raises(IRError) as e:
        check_module(module)
    err = e.value
    assert err.code == "CUVIL-IR"
    assert fragment in err.message, err.message
    if where is not None:
        assert err.location == where, err.location
    assert err.hint
    return err


def module_of(*results, params=(), constraints=(), names=None, constants=None):
    names = names or [f"out{i}" for i in range(len(results))]
    return Module((Function("main", tuple(params), tuple(results), tuple(names), tuple(constraints)),),
                  constants or {})


# --------------------------------------------------------------------------------------
# what passes


def test_builder_modules_pass_for_every_catalogue_example():
    for op in all_ops():
        for arrays, attrs in op.examples(np.random.default_rng(0)):
            b = Builder()
            params = [b.param(f"in{i}", DType.from_numpy(a.dtype), a.shape) for i, a in enumerate(arrays)]
            consts = [b.const(a) for a in arrays]
            m = b.module(b.function("main", params, [b.op(op.name, *params, **attrs),
                                                     b.op(op.name, *consts, **attrs)]))
            check_module(m)


def test_symbolic_function_with_constraints_passes():
    b = Builder()
    n = sym("N")
    x = b.param("x", DType.f32, [n, 4])
    y = b.reshape(b.relu(x), shape=[n * 2, 2])
    check_module(b.module(b.function("main", [x], [y], ["y"], [DimConstraint("N", 1, 64, 8)])))


# --------------------------------------------------------------------------------------
# operands


def test_param_of_another_function_is_not_defined():
    x, stray = param("x", F32_23), param("stray", F32_23)
    v = Value("add", (x, stray), {}, F32_23)
    broken("%stray is used but is not a parameter of @main", module_of(v, params=[x]), where="@main: %stray")


def test_missing_constant():
    k = Value("const", (), {"hash": "k0000000000000000dead"}, F32_23)
    v = Value("relu", (k,), {}, F32_23)
    broken("constant @k0000000000000000dead is not in the module", module_of(v))


def test_constant_type_must_match_its_data():
    b = Builder()
    good = b.const(np.zeros((2, 3), np.float32))
    lying = Value("const", (), {"hash": good.const_hash}, TensorType(DType.f32, (3, 2)))
    m = Module((Function("main", (), (good, lying), ("a", "b")),), b.constants)
    broken("const value has type f32[3, 2], its data is f32[2, 3]", m)


def test_unknown_op():
    x = param("x", F32_23)
    v = Value("frobnicate", (x,), {}, F32_23)
    broken("unknown op 'frobnicate'", module_of(v, params=[x]), where="@main: %0 = frobnicate")


# --------------------------------------------------------------------------------------
# attributes, arity, types


def test_attributes_must_be_complete_known_and_of_the_declared_kind():
    x = param("x", F32_23)
    missing = Value("transpose", (x,), {}, TensorType(DType.f32, (3, 2)))
    broken("requires attribute 'perm'", module_of(missing, params=[x]))
    unknown = Value("relu", (x,), {"bogus": 1}, F32_23)
    broken("has no attribute 'bogus'", module_of(unknown, params=[x]))
    no_default = Value("matmul", (x, param("w", TensorType(DType.f32, (3, 4)))), {"transpose_a": False},
                       TensorType(DType.f32, (2, 4)))
    broken("attribute 'transpose_b' is missing", module_of(no_default, params=[x, no_default.operands[1]]))
    wrong_kind = Value("matmul", (x, no_default.operands[1]), {"transpose_a": 0, "transpose_b": False},
                       TensorType(DType.f32, (2, 4)))
    broken("attribute 'transpose_a' is stored as 0 (int); its definition wants bool",
           module_of(wrong_kind, params=[x, no_default.operands[1]]))


def test_recorded_type_must_equal_the_shape_rule():
    x = param("x", F32_23)
    v = Value("relu", (x,), {}, TensorType(DType.f32, (2, 4)))
    broken("recorded type f32[2, 4] differs from f32[2, 3]", module_of(v, params=[x]),
           where="@main: %0 = relu")
    dt = Value("relu", (x,), {}, TensorType(DType.f16, (2, 3)))
    broken("recorded type f16[2, 3] differs from f32[2, 3]", module_of(dt, params=[x]))


def test_shape_rule_rejections_and_arity():
    x = param("x", F32_23)
    bad = Value("matmul", (x, x), {"transpose_a": False, "transpose_b": False}, F32_23)
    broken("the shape rule rejects the operands", module_of(bad, params=[x]))
    arity = Value("add", (x,), {}, F32_23)
    broken("add takes 2 operands, got 1", module_of(arity, params=[x]))


def test_negative_dims_and_unbound_symbols():
    neg = param("x", TensorType(DType.f32, (-1, 3)))
    broken("has a negative dim", module_of(Value("relu", (neg,), {}, neg.type), params=[neg]))
    x = param("x", TensorType(DType.f32, (sym("N"), 3)))
    v = Value("reshape", (x,), {"shape": (sym("M"), 3)}, TensorType(DType.f32, (sym("M"), 3)))
    broken("uses symbol(s) M that no parameter's shape binds", module_of(v, params=[x]))


# --------------------------------------------------------------------------------------
# names and constraints


def test_parameter_names_are_unique():
    a, b = param("x", F32_23), param("x", TensorType(DType.f32, (3,)))
    broken("two parameters are named %x", module_of(a, b, params=[a, b]))


def test_result_names_are_unique_and_match_the_results():
    x = param("x", F32_23)
    broken("two results are named %y", module_of(x, x, params=[x], names=["y", "y"]))
    broken("2 results but 1 result names", module_of(x, x, params=[x], names=["y"]))


def test_a_parameter_must_be_a_param_value():
    x = param("x", F32_23)
    r = Value("relu", (x,), {}, F32_23)
    broken("is not a named parameter", module_of(r, params=[x, r]))


def test_constraints_refer_to_used_symbols_once_and_are_satisfiable():
    x = param("x", TensorType(DType.f32, (sym("N"), 3)))
    broken("refers to symbol M, which no parameter's shape uses",
           module_of(x, params=[x], constraints=[DimConstraint("M", 1, 8)]))
    broken("symbol N is constrained twice",
           module_of(x, params=[x], constraints=[DimConstraint("N"), DimConstraint("N", 1, 8)]))
    broken("admits no value", module_of(x, params=[x], constraints=[DimConstraint("N", 9, 15, 8)]))
    broken("admits no value", module_of(x, params=[x], constraints=[DimConstraint("N", 5, 4)]))
    broken("admits negative sizes", module_of(x, params=[x], constraints=[DimConstraint("N", -1)]))
    broken("non-positive modulus", module_of(x, params=[x], constraints=[DimConstraint("N", 1, None, 0)]))
    check_module(module_of(x, params=[x], constraints=[DimConstraint("N", 9, 16, 8)]))


def test_function_names_are_unique():
    x = param("x", F32_23)
    f = Function("main", (x,), (x,), ("y",))
    with pytest.raises(IRError, match="two functions are named @main"):
        check_module(Module((f, f)))


# --------------------------------------------------------------------------------------
# regions


def test_region_bodies_are_checked():
    b = Builder()
    a0 = Region.arg(0, F32_23)
    x = b.param("x", DType.f32, [2, 3])
    lying_body = Region((a0,), Value("relu", (a0,), {}, TensorType(DType.f32, (2, 4))))
    v = Value("fused", (x,), {"body": lying_body, "kind": "elementwise"}, TensorType(DType.f32, (2, 4)))
    err = broken("recorded type f32[2, 4] differs from f32[2, 3]", module_of(v, params=[x]))
    assert "(region)" in err.location
    outer = Region((a0,), b.add(a0, x))  # refers to the function's parameter, not its own argument
    v2 = Value("fused", (x,), {"body": outer, "kind": "elementwise"}, F32_23)
    broken("%x is used but is not a parameter of @main: %0 = fused (region)", module_of(v2, params=[x]))
    k = b.const(np.ones((2, 3), np.float32))
    with_const = Region((a0,), b.add(a0, k))
    v3 = Value("fused", (x,), {"body": with_const, "kind": "elementwise"}, F32_23)
    broken("a region body refers to constant", Module((Function("main", (x,), (v3,), ("y",)),), b.constants))


def test_scalar_and_one_element_constants_stay_distinct():
    """A scalar and a one-element vector with the same bytes are different constants."""
    b = Builder()
    scalar, vector = b.const(np.array(3, np.int64)), b.const(np.array([3], np.int64))
    assert scalar.const_hash != vector.const_hash
    m = b.module(b.function("main", [], [scalar, vector], ["s", "v"]))
    check_module(m)
    assert m.constants[scalar.const_hash].shape == ()
    assert m.constants[vector.const_hash].shape == (1,)
