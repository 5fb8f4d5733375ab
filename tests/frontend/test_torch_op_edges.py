"""ATen ops at their edges through torch.export, on the interpreter and a compiled library, against eager PyTorch.

Each case is a disagreement or a refusal random single-op modules found: rank-0 inputs to ops along a dim
(softmax, sort, cumsum, max/min with indices), arithmetic on bool masks (``isfinite``, ``isclose`` and
``logaddexp`` decompose to a ``mul`` of masks), python ints outside a narrow integer type (torch wraps them:
-1 is 255 in uint8), ``any`` on uint8, a None output, unbatched pools, torch's float floor division, ``sign``
of NaN, ``log1p``/``expm1`` of small values, ``fmax``/``fmin``, ``var`` with a correction past N, ``var_mean``,
rounding and NaN tests on integers, a descending sort of bools, and ops that were refused: ``diagonal`` (so
``trace``, ``diag`` and ``einsum('ii->i')``), ``signbit``, ``copysign``, ``atan2``, ``addmv``, RReLU in evaluation,
a scalar's remainder by a tensor, adaptive max pools; integer tensors to whole constant powers, exact and
wrapping as torch's products.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import cuvil  # noqa: E402
from cuvil.arrays import from_torch  # noqa: E402
from cuvil.compiler import compile  # noqa: E402

inf, nan = float("inf"), float("nan")


class _Fn(torch.nn.Module):
    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs: Any) -> Any:
        return self.fn(*xs)


def _gen() -> Any:
    return torch.Generator().manual_seed(0)


_SCALAR = torch.tensor(1.5)
_SPECIALS = torch.tensor([1e-10, -1e-7, 1e-7, 0.5, -0.5, 3.0, 100.0, 1000.0, -1000.0, inf, -inf, nan, 0.0, -0.0,
                          -1.0, -0.9999, 1e-30, -2.0])
_U8 = torch.tensor([0, 5, 200], dtype=torch.uint8)
_AXES = [0.0, -0.0, 1.0, -1.0, inf, -inf, nan, 1e-30, -2.5, 1e30]
_NUMERATORS = torch.tensor([1.0, inf, -1.0, 7.0, -7.0, 7.0, -7.0, 0.0, -0.0, 5.0, 1e30, 3.0, nan, 1.0, -1.0, 0.3])
_DIVISORS = torch.tensor([0.1, 2.0, inf, 2.0, 2.0, -2.0, -2.0, 3.0, 3.0, 0.0, 7.0, -inf, 1.0, -inf, -inf, 0.1])

CASES: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
    "softmax_rank0": (lambda x: F.softmax(x, dim=0), (_SCALAR,)),
    "log_softmax_rank0": (lambda x: F.log_softmax(x, dim=-1), (_SCALAR,)),
    "sort_rank0": (lambda x: torch.sort(x, dim=0, descending=True), (_SCALAR,)),
    "cumsum_rank0": (lambda x: torch.cumsum(x, 0), (_SCALAR,)),
    "max_dim_rank0": (lambda x: torch.max(x, -1, keepdim=True), (_SCALAR,)),
    "argmax_rank0": (lambda x: torch.argmax(x, dim=0, keepdim=True), (_SCALAR,)),
    "topk_rank0": (lambda x: torch.topk(x, 1, dim=0), (_SCALAR,)),
    "isfinite": (torch.isfinite, (_SPECIALS,)),
    "isclose": (lambda x, y: torch.isclose(x, y, rtol=1e-5, atol=1e-3, equal_nan=True),
                (torch.tensor([1.0, nan, 2.0, inf]), torch.tensor([1.0001, nan, 3.0, inf]))),
    "logaddexp": (torch.logaddexp, (torch.tensor([1.0, -inf, 3.0]), torch.tensor([2.0, -inf, inf]))),
    "bool_mul_add": (lambda x, y: x * y + x, (torch.tensor([True, False, True]), torch.tensor([True, True, False]))),
    "clamp_uint8_minus_one": (lambda x: torch.clamp(x, -1, 1), (_U8,)),
    "clamp_min_uint8": (lambda x: torch.clamp_min(x, -1), (_U8,)),
    "sub_alpha_uint8": (lambda x, y: torch.sub(x, y, alpha=-1), (_U8, torch.tensor([3, 100, 100], dtype=torch.uint8))),
    "add_minus_one_uint8": (lambda x: x + (-1), (_U8,)),
    "scatter_minus_one_uint8": (lambda x: torch.scatter(x, 0, torch.tensor([1]), -1), (_U8,)),
    "new_full_uint8": (lambda x: x.new_full((2,), -1), (_U8,)),
    "any_uint8": (lambda x: torch.any(x, dim=0), (torch.tensor([[0, 3], [0, 0]], dtype=torch.uint8),)),
    "max_pool2d_unbatched": (lambda x: F.max_pool2d(x, 2), (torch.randn(3, 6, 7, generator=_gen()),)),
    "avg_pool2d_unbatched": (lambda x: F.avg_pool2d(x, 3, 2, 1), (torch.randn(3, 6, 7, generator=_gen()),)),
    "max_pool1d_unbatched": (lambda x: F.max_pool1d(x, 2), (torch.randn(3, 8, generator=_gen()),)),
    "avg_pool3d_unbatched": (lambda x: F.avg_pool3d(x, 2), (torch.randn(2, 4, 4, 6, generator=_gen()),)),
    "floor_divide": (lambda x, y: (torch.div(x, y, rounding_mode="floor"), x // y), (_NUMERATORS, _DIVISORS)),
    "floor_divide_bf16": (lambda x, y: x // y, (torch.randn(2000, generator=_gen()).to(torch.bfloat16) * 10,
                                                torch.randn(2000, generator=_gen()).to(torch.bfloat16) / 5)),
    "sign": (torch.sign, (_SPECIALS,)),
    "sgn": (torch.sgn, (_SPECIALS,)),
    "log1p": (torch.log1p, (_SPECIALS,)),
    "expm1": (torch.expm1, (_SPECIALS,)),
    "fmax": (torch.fmax, (torch.tensor([1.0, nan, nan, -1.0]), torch.tensor([nan, 2.0, nan, 0.0]))),
    "fmin": (torch.fmin, (torch.tensor([1.0, nan, nan, 3.0]), torch.tensor([nan, 2.0, nan, 0.0]))),
    "var_correction_past_n": (lambda x: torch.var(x, correction=3), (torch.tensor([1.0, 2.0]),)),
    "std_correction_equal_n": (lambda x: torch.std(x, dim=0, correction=2), (torch.tensor([[1.0, 2.0], [1.0, 5.0]]),)),
    "var_mean": (lambda x: torch.var_mean(x, dim=1, correction=1, keepdim=True),
                 (torch.randn(3, 4, generator=_gen()),)),
    "std_mean": (lambda x: torch.std_mean(x, dim=0), (torch.randn(3, 4, generator=_gen()),)),
    "floor_int": (torch.floor, (torch.tensor([1, -2, 3]),)),
    "round_int8": (torch.round, (torch.tensor([1, -2, 3], dtype=torch.int8),)),
    "isnan_int": (torch.isnan, (torch.tensor([1, -2, 3]),)),
    "isinf_bool": (torch.isinf, (torch.tensor([True, False]),)),
    "argsort_bool_descending": (lambda x: torch.argsort(x, descending=True, stable=True),
                                (torch.tensor([True, False, True, False]),)),
    "sort_stable_ties": (lambda x: torch.sort(x, dim=-1, descending=True, stable=True),
                         (torch.randint(0, 4, (3, 50), generator=_gen()).float(),)),
    "diagonal": (lambda x: (torch.diagonal(x, 0, 1, 2), torch.diagonal(x, 2, 1, 2), torch.diagonal(x, -2, 1, 2),
                            torch.diagonal(x, 1, 2, 0), torch.diagonal(x, -1, -1, -3), torch.diagonal(x, 7, 1, 2)),
                 (torch.randn(2, 4, 5, generator=_gen()),)),
    "trace_diag_einsum": (lambda x: (torch.trace(x), torch.diag(x), torch.einsum("ii->i", x)),
                          (torch.arange(16.0).reshape(4, 4),)),
    "signbit": (torch.signbit, (_SPECIALS,)),
    "copysign": (torch.copysign, (_NUMERATORS, _DIVISORS)),
    "remainder_scalar_tensor": (lambda x: (7 % x, 7.5 % x.float()), (torch.tensor([2, -3, 5, 4]),)),
    "atan2": (torch.atan2, (torch.tensor([a for a in _AXES for _ in _AXES]),
                            torch.tensor([b for _ in _AXES for b in _AXES]))),
    "addmv": (lambda b, m, v: (torch.addmv(b, m, v, beta=0.5, alpha=2.0), torch.addmv(b, m, v)),
              (torch.randn(4, generator=_gen()), torch.randn(4, 3, generator=_gen()),
               torch.randn(3, generator=_gen()))),
    "integer_powers": (lambda x, u: (x ** 39, x ** 0, x ** 1, torch.pow(x.int(), 3), u ** 2),
                       (torch.tensor([3, -3, 2, 7, 100]), torch.tensor([7, 15, 200], dtype=torch.uint8))),
    "adaptive_max_pool": (lambda x, u: (F.adaptive_max_pool2d(x, (3, 5)), F.adaptive_max_pool2d(x, 2),
                                        F.adaptive_max_pool1d(x[0], 3), F.adaptive_max_pool2d(u, (3, 3))),
                          (torch.randn(2, 3, 8, 6, generator=_gen()), torch.randn(3, 7, 7, generator=_gen()))),
    "rrelu_eval": (lambda x: torch.nn.functional.rrelu(x, 0.1, 0.3), (torch.randn(3, 5, generator=_gen()),)),
    "atan2_random": (torch.atan2, (torch.randn(3000, generator=_gen()) * 5, torch.randn(3000, generator=_gen()) * 5)),
}
"""name -> (function, inputs). Every output must equal eager's (NaN matching NaN; ``log1p``, ``expm1`` and
``atan2``, whose torch kernels call the C library's, within 2 ulps, and sums of products, ``addmv``'s, whose
float32 kernels fuse multiply-adds where the rule rounds each product)."""

_WITHIN_ULPS = {"log1p", "expm1", "var_mean", "std_mean", "atan2", "atan2_random", "addmv"}


def _same(got: np.ndarray, want: np.ndarray, close: bool) -> bool:
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if want.dtype.kind != "f" and str(want.dtype) != "bfloat16":
        return bool(np.array_equal(got, want))
    g, w = got.astype(np.float64), want.astype(np.float64)
    if close:
        return bool(np.allclose(g, w, rtol=2.5e-7, atol=0.0, equal_nan=True))
    return bool(np.array_equal(g, w, equal_nan=True)) and bool(np.array_equal(np.signbit(g), np.signbit(w)))


@pytest.mark.parametrize("name", sorted(CASES))
def test_aten_edge_matches_eager(name: str) -> None:
    fn, args = CASES[name]
    module = _Fn(fn).eval()
    with torch.no_grad():
        want = [from_torch(t, "out") for t in torch.utils._pytree.tree_leaves(module(*args))
                if isinstance(t, torch.Tensor)]
    cir = cuvil.import_model(module, args)
    xs = [from_torch(a, "x") for a in args]
    interpreted, compiled = cuvil.run_reference(cir, xs), compile(cir, cache=False).run(xs)
    assert len(interpreted) == len(compiled) == len(want)
    for k, w in enumerate(want):
        for path, got in (("interpreter", interpreted[k]), ("library", compiled[k])):
            assert _same(np.asarray(got), w, name in _WITHIN_ULPS), f"{path} output {k}: {got} against {w}"


def test_a_none_output_is_left_out() -> None:
    """MultiheadAttention without weights returns ``(output, None)``: the library has the one tensor result."""
    torch.manual_seed(0)
    attention = torch.nn.MultiheadAttention(4, 1).eval()
    module = _Fn(lambda q, k: attention(q, k, k, need_weights=False)).eval()
    q, k = torch.randn(3, 1, 4, generator=_gen()), torch.randn(2, 1, 4, generator=_gen())
    cir = cuvil.import_model(module, (q, k))
    (got,) = compile(cir, cache=False).run([q.numpy(), k.numpy()])
    with torch.no_grad():
        want = module(q, k)[0].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_max_pool_indices_are_refused_by_name() -> None:
    module = _Fn(lambda x: F.max_pool2d(x, 3, stride=1, padding=1, return_indices=True)).eval()
    with pytest.raises(cuvil.CuvilError, match="max_pool2d_with_indices") as refused:
        cuvil.import_model(module, (torch.randn(1, 2, 5, 5),))
    assert refused.value.code == "CUVIL-UNSUPPORTED-OP"
