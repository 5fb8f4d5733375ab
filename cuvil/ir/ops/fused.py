"""Fused ops: a region of other ops evaluated as one. Its meaning is the composition of
the body ops' rules (cuvil.ir.inline), so nothing about it is written twice."""

from __future__ import annotations

from typing import Any

import numpy as np

from cuvil.ir import rules as R
from cuvil.ir.evaluate import evaluate_region
from cuvil.ir.inline import value_rule
from cuvil.ir.opdef import REQUIRED, define
from cuvil.ir.region import Region
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value


def _fused_type(types: list[TensorType], body: Region, kind: str) -> TensorType:
    if not isinstance(body, Region):
        raise TypeError(f"body must be a Region, got {type(body).__name__}")
    if len(types) != len(body.params):
        raise ValueError(f"{len(types)} operands for a body with {len(body.params)} arguments")
    if body.more:
        raise ValueError(f"a fused body yields one value, this one yields {len(body.results)}")
    for k, (t, p) in enumerate(zip(types, body.params, strict=True)):
        if t != p.type:
            raise ValueError(f"operand {k} is {t}, the body argument is {p.type}")
    body.check()
    return body.result.type


def _fused_rule(c: R.RuleCtx) -> R.Expr:
    body: Region = c.attrs["body"]
    position = {p: k for k, p in enumerate(body.params)}

    def leaf(v: Value, index: tuple[R.Ix, ...], ld: R.Load) -> R.Expr:
        return c.inputs[position[v]].at(*index, oob=ld.oob)

    if body.result.is_param:  # a body that yields one of its arguments unchanged
        return c.inputs[position[body.result]].at(*c.out)
    return value_rule(body.result, c.out, leaf, inline=lambda v: not v.is_param)


def _fused_numpy(xs: list[np.ndarray], out: TensorType, body: Region, kind: str) -> np.ndarray:
    return evaluate_region(body, xs)


def _examples(rng: np.random.Generator) -> list[tuple[list[np.ndarray], dict[str, Any]]]:
    from cuvil.ir.builder import Builder
    from cuvil.ir.dtypes import DType

    b = Builder()
    t_a, t_b = TensorType(DType.f32, (2, 3)), TensorType(DType.f32, (3,))
    a, bias = Region.arg(0, t_a), Region.arg(1, t_b)
    chain = Region((a, bias), b.relu(b.add(a, bias)))
    w_t = TensorType(DType.f32, (4, 3))
    x, w = Region.arg(0, t_a), Region.arg(1, w_t)
    epilogue = Region((x, w, Region.arg(2, TensorType(DType.f32, (4,)))),
                      b.relu(b.add(b.matmul(x, w, transpose_b=True), Region.arg(2, TensorType(DType.f32, (4,))))))
    return [
        ([rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)],
         {"body": chain}),
        ([rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32),
          rng.standard_normal(4).astype(np.float32)], {"body": epilogue, "kind": "epilogue"}),
    ]


define("fused", ("*inputs",), attrs={"body": ("any", REQUIRED), "kind": ("str", "elementwise")},
       shape=_fused_type, rule=_fused_rule, numpy=_fused_numpy, family="fused", examples=_examples,
       doc="a region of ops evaluated as one (elementwise chains, GEMM/conv epilogues)")
