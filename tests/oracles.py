"""Reference answers that tests in several folders compare with: a module evaluated by its ops'
compute rules alone, the bitwise agreement a kernel must reach with it, the agreement a frontend's
outputs must reach with PyTorch eager, and where ONNX Runtime's int8 products can be an oracle."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from bench.models import agreement
from cuvil.interp import bind_inputs, evaluate_op
from cuvil.ir.module import Module
from cuvil.ir.opdef import get_op
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value


def rule_reference(module: Module, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Every result of ``module.main``, each op evaluated from its compute rule (no numpy fast path):
    the literal meaning a compiled library must reproduce."""
    fn = module.main
    arrays, _ = bind_inputs(fn, list(inputs))
    memo: dict[Value, np.ndarray] = dict(zip(fn.params, arrays, strict=True))
    for v in fn.values():
        if v in memo:
            continue
        if v.is_const:
            memo[v] = module.constants[v.const_hash]
            continue
        memo[v] = evaluate_op(get_op(v.op), [memo[o] for o in v.operands], v.attr_dict,
                              TensorType(v.dtype, v.type.shape), use_fast_path=False)
    return [memo[r] for r in fn.results]


def same_float32_bits(got: np.ndarray, want: np.ndarray) -> bool:
    """Float32 arrays of one shape, bit for bit, except that any NaN equals any NaN (which operand's payload
    an IEEE operation keeps is not part of the meaning, and LLVM may commute a sum's or product's operands)."""
    nan = np.isnan(want)
    return bool(got.shape == want.shape and np.array_equal(np.isnan(got), nan)
                and np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32)))


SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 3e38, -3e38, 1e-45], dtype=np.float32)
"""Values a float32 kernel must carry through as its rule does: NaN, infinities, signed zeros, values near
overflow, the smallest subnormal."""


def float32_with_specials(shape: tuple[int, ...], rng: np.random.Generator, scales: Sequence[float],
                          every: int) -> np.ndarray:
    """Normal values at mixed ``scales``, one element in ``every`` replaced by one of :data:`SPECIALS`."""
    x = (rng.standard_normal(shape) * rng.choice(scales, shape)).astype(np.float32)
    flat = x.reshape(-1)
    pick = rng.choice(flat.size, size=max(1, flat.size // every), replace=False)
    flat[pick] = rng.choice(SPECIALS, pick.size)
    return x


def assert_agrees(outs: list[np.ndarray], refs: list[np.ndarray]) -> None:
    """Same number, shapes and dtypes of outputs, each within 1e-4 of its reference's scale and at a
    cosine of 0.99999 or more."""
    assert len(outs) == len(refs)
    for got, want in zip(outs, refs, strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype
        a = agreement(got, want)
        assert a.within(rtol=1e-4, min_cosine=0.99999), a


@functools.cache
def ort_sums_u8s8_exactly() -> bool:
    """Whether this host's ONNX Runtime sums uint8 x int8 products exactly. Without VNNI its x86 kernels add
    each pair of products in 16 bits with saturation (``vpmaddubsw``): 255 * -128 twice gives -32768, not
    -65280 (seen on a Zen 3). Where it saturates, a test that takes ONNX Runtime as the oracle of an int8
    product gives it weights in [-64, 63] (:func:`oracle_int8_weights`), whose pairs fit 16 bits, as ONNX
    Runtime's quantizer does with ``reduce_range``; Cuvil's own kernels are tested over the whole range
    against the rule."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
    graph = helper.make_graph([node], "probe", [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, 2]),
                                                helper.make_tensor_value_info("b", TensorProto.INT8, [2, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"a": np.full((1, 2), 255, np.uint8), "b": np.full((2, 1), -128, np.int8)})
    return int(y[0, 0]) == -65280


def oracle_int8_weights(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Int8 weights for a product ONNX Runtime is the oracle of: the whole range where it sums them exactly,
    else [-64, 63] (:func:`ort_sums_u8s8_exactly`)."""
    lo, hi = (-128, 127) if ort_sums_u8s8_exactly() else (-64, 63)
    return rng.integers(lo, hi + 1, shape).astype(np.int8)
