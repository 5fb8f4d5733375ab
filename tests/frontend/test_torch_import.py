"""torch.export frontend: per-op conversions against PyTorch eager, dynamic dims, the converter
registry, .pt2 files, and the errors a user can run into."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import cuvil  # noqa: E402
from cuvil.errors import CuvilError, ModelLoadError, UnsupportedOpError  # noqa: E402
from cuvil.frontend.torch_import import aten_converters, import_torch, sympy_to_dim  # noqa: E402
from cuvil.ir.opdef import all_ops  # noqa: E402
from cuvil.ir.symbolic import Sym  # noqa: E402


class Fn(nn.Module):
    """Wraps a function so each op case is a one-line lambda."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs: Any) -> Any:
        return self.fn(*xs)


def _rand(*shape: int, seed: int = 0) -> Any:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed + sum(shape)))


def _index_put(x: Any, indices: list[Any], values: Any, accumulate: bool = False) -> Any:
    """``index_put`` with whole axes (``None``) among the indices, which ``Tensor.index_put`` does not take."""
    return torch.ops.aten.index_put.default(x, indices, values, accumulate)


def _ints(*shape: int, hi: int = 10, seed: int = 0) -> Any:
    return torch.randint(0, hi, shape, generator=torch.Generator().manual_seed(seed))


def _check(model: Any, inputs: tuple, **options: Any) -> cuvil.ir.Module:
    """Import, run on the interpreter, and compare every output with eager PyTorch."""
    module = cuvil.import_model(model, inputs, **options)
    outs = cuvil.run_reference(module, [t.numpy() for t in inputs])
    with torch.no_grad():
        ref = model(*inputs)
    refs = [r for r in torch.utils._pytree.tree_leaves(ref) if isinstance(r, torch.Tensor)]
    assert len(outs) == len(refs)
    for got, want in zip(outs, refs, strict=True):
        want = want.numpy()
        assert got.shape == want.shape
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        if want.dtype.kind == "f":
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())))
        else:
            np.testing.assert_array_equal(got, want)
    return module


# one case per converter family: (id, function, inputs)
CASES: list[tuple[str, Callable[..., Any], tuple]] = [
    ("add_alpha_scalar", lambda x, y: torch.add(x, y, alpha=2.0) + 1.5, (_rand(2, 3), _rand(3))),
    ("sub_rsub", lambda x, y: (x - y) - (1.0 - x), (_rand(2, 3), _rand(2, 3, seed=1))),
    ("mul_div", lambda x, y: x * y / (y.abs() + 1.0) * 0.5, (_rand(2, 3), _rand(2, 3, seed=1))),
    ("int_true_div", lambda a, b: a / (b + 1), (_ints(2, 3), _ints(2, 3, seed=1))),
    ("floor_divide", lambda a, b: torch.div(a - 5, b + 1, rounding_mode="floor"), (_ints(3, 4), _ints(3, 4, seed=2))),
    ("trunc_divide", lambda x: torch.div(x, 0.7, rounding_mode="trunc"), (_rand(3, 4),)),
    ("remainder", lambda x: torch.remainder(x, 0.8) + torch.fmod(x, 0.6), (_rand(3, 4),)),
    ("pow_sqrt_rsqrt", lambda x: torch.pow(x, 2) + torch.sqrt(x.abs()) + torch.rsqrt(x.abs() + 1) + 2.0 ** x,
     (_rand(2, 5),)),
    ("unary_math", lambda x: torch.exp(x) + torch.log(x.abs() + 1) + torch.erf(x) + torch.tanh(x) + torch.sin(x)
     + torch.cos(x) - torch.neg(x) + torch.reciprocal(x.abs() + 1), (_rand(2, 5),)),
    ("rounding", lambda x: torch.floor(x * 3) + torch.ceil(x * 3) + torch.round(x * 3) + torch.sign(x),
     (_rand(4, 5),)),
    ("activations", lambda x: F.relu(x) + torch.sigmoid(x) + F.silu(x) + F.gelu(x) + F.gelu(x, approximate="tanh")
     + F.relu6(x * 4) + F.hardtanh(x, -0.5, 0.5) + F.leaky_relu(x, 0.2) + F.elu(x) + F.hardswish(x)
     + F.hardsigmoid(x) + F.softplus(x) + F.mish(x), (_rand(3, 7),)),
    ("clamp", lambda x: torch.clamp(x, -0.3, 0.4) + torch.clamp(x, min=0.1) + torch.clamp(x, max=-0.1),
     (_rand(3, 4),)),
    ("clamp_tensor", lambda x, lo: torch.clamp(x, min=lo), (_rand(3, 4), _rand(4, seed=3))),
    ("minimum_maximum", lambda x, y: torch.minimum(x, y) * torch.maximum(x, y), (_rand(3, 4), _rand(4, seed=5))),
    ("compare_where", lambda x, y: torch.where(x > y, x, y) + torch.where(x <= 0.1, 1.0, 0.0)
     + (x == x).float() + (x != y).float() + (x < 0).float() + (x >= y).float(), (_rand(3, 4), _rand(3, 4, seed=1))),
    ("masked_fill", lambda x: x.masked_fill(x < 0, -1e4), (_rand(3, 4),)),
    ("logical_bitwise", lambda a, b: ((a > 3) & (b < 5)) | ((a == b) ^ (a < 2)) | ~(b > 7),
     (_ints(3, 4), _ints(3, 4, seed=4))),
    ("int_bitwise", lambda a, b: (a & b) + (a | b) + (a ^ b), (_ints(3, 4, hi=50), _ints(3, 4, hi=50, seed=4))),
    ("casts", lambda x: x.to(torch.int32).to(torch.float32) + x.double().float() + (x > 0).long(), (_rand(3, 4) * 5,)),
    ("softmax", lambda x: torch.softmax(x, -1) + torch.log_softmax(x, 1) + F.softmax(x, dim=0), (_rand(3, 6),)),
    ("reductions", lambda x: x.sum(1, keepdim=True) + x.mean((0, 2), keepdim=True) + x.amax(-1, keepdim=True)
     - x.amin(0) + x.sum() + x.mean(), (_rand(2, 3, 4),)),
    ("max_argmax", lambda x: (x.max(dim=1)[0], x.max(dim=1)[1], x.argmax(-1), x.argmin(0, keepdim=True),
                              x.min(dim=2, keepdim=True)[0]), (_rand(2, 5, 4),)),
    ("var_prod", lambda x: x.var(1).sum(-1) + x.var(-1, unbiased=False, keepdim=True).sum((1, 2)) + x.prod(-1).sum(-1),
     (_rand(3, 4, 5),)),
    ("any_all", lambda x: (x > 1).any(-1) | (x > -2).all(0), (_rand(4, 4),)),
    ("cumsum", lambda x, m: torch.cumsum(x, 1) + torch.cumsum(m > 4, -1).float(), (_rand(3, 5), _ints(3, 5))),
    ("views", lambda x: x.view(6, 4).reshape(2, 12).unsqueeze(1).squeeze(1).flatten().view(4, 3, 2)
     .permute(2, 0, 1).transpose(0, 2).flatten(1).t().contiguous(), (_rand(2, 3, 4),)),
    ("expand_repeat", lambda x: x.expand(3, 4, 5) + x.repeat(3, 1, 1), (_rand(1, 4, 5),)),
    ("cat_stack", lambda x, y: torch.cat([x, y, x], dim=1) + torch.stack([x, y], -1).sum(-1).repeat(1, 3),
     (_rand(2, 3), _rand(2, 3, seed=7))),
    ("slice_select", lambda x: x[:, 1:3] * x[:, -2:] + x[0, :2] + x[..., ::2, :][:, :2] + x[-1, -1, :2],
     (_rand(3, 4, 2),)),
    ("split_chunk_unbind", lambda x: sum(x.split([1, 3], 1)[1].unbind(1)) + x.chunk(2, dim=1)[0].sum(1),
     (_rand(2, 4, 3),)),
    ("index_select_gather", lambda x, i: x.index_select(1, i) + torch.gather(x, 1, i.expand(3, 2)),
     (_rand(3, 5), torch.tensor([4, 0]))),
    ("advanced_index", lambda x, i, j: x[i, j] + x[:, j].sum(0) + x[i].sum((1, 2))[:, None],
     (_rand(5, 6), torch.tensor([[0], [3], [4]]), torch.tensor([1, 5]))),
    ("advanced_index_middle", lambda x, i, j: x[:, i, j], (_rand(2, 5, 6), torch.tensor([0, 3, 4]),
                                                          torch.tensor([1, 5, 2]))),
    ("scatter", lambda x, i, u: (x.scatter(1, i, u), x.scatter(0, i[:1].clamp(max=2), 2.5), x.scatter_add(1, i, u),
                                 x.scatter_reduce(1, i, u, "amax")),
     (_rand(3, 5), torch.tensor([[0, 4], [1, 1], [3, 2]]), _rand(3, 2, seed=4))),
    ("std", lambda x: x.std(1) + x.std(-1, correction=0).sum(-1, keepdim=True), (_rand(3, 6),)),
    ("vector_norms", lambda x: (torch.linalg.vector_norm(x), torch.linalg.vector_norm(x, 1, dim=1),
                                torch.linalg.vector_norm(x, float("inf"), dim=(0, 2), keepdim=True),
                                torch.linalg.vector_norm(x, float("-inf"), dim=-1),
                                torch.linalg.vector_norm(F.relu(x), 0, dim=1), torch.linalg.vector_norm(x, 3, dim=2),
                                torch.linalg.vector_norm(x, 0.5, dim=(1, 2)), torch.norm(x, dim=1), x.norm(p=1)),
     (_rand(3, 4, 5),)),
    ("slice_scatter", lambda x, y, z: (torch.slice_scatter(x, y, dim=1, start=1, end=3),
                                       torch.slice_scatter(x, y, dim=1, start=0, end=4, step=2),
                                       torch.slice_scatter(x, x[:1] * 2, dim=0, start=-1),
                                       torch.select_scatter(x, z, 1, -1), torch.select_scatter(x, z, 1, 0)),
     (_rand(3, 5, 2), _rand(3, 2, 2, seed=1), _rand(3, 2, seed=2))),
    ("slice_assignment", lambda x, y: _assigned(x, y), (_rand(2, 6), _rand(2, 3, seed=1))),
    ("masked_assignment", lambda x: _masked(x), (_rand(3, 4),)),
    ("as_strided", lambda x: (x.as_strided((3, 2), (1, 4)), x.as_strided((2, 2, 2), (6, 1, 2), 1),
                              (x + 1).as_strided((3, 4), (4, 1))), (_rand(3, 4),)),
    ("embedding", lambda i: F.embedding(i, torch.arange(40.0).view(10, 4)), (_ints(2, 3),)),
    ("index_put", lambda x, v: (x.index_put((torch.tensor([2, 0, -2]),), v[0]),
                                x.index_put((torch.tensor([1, 1, 0]),), v[0], accumulate=True),
                                x.index_put((torch.tensor([[0], [2]]), torch.tensor([1, 3])), v[1, 0, 0]),
                                _index_put(x, [torch.tensor([0, 1, 1]), None, torch.tensor([2, 0, 0])],
                                           v[0, :, :3].T, True),  # axes apart: the index axes first
                                _index_put(x, [None, torch.tensor([3, 1]), torch.tensor([[0], [4]])],
                                           torch.tensor(5.0)),  # axes together after the first: in place
                                _index_put(x, [x[:, :, 0] > 0], torch.tensor(-2.0)),  # x[mask] = v: a where
                                _index_put(x, [None, v[0] < 0], torch.tensor([0.5]), True)),
     (_rand(3, 4, 5), _rand(3, 4, 5, seed=1))),
    ("fold", lambda x: (F.fold(x, (5, 6), (2, 3), stride=(1, 2), padding=1),  # col2im: overlapping windows add
                        F.fold(F.unfold(x.flatten()[:60].view(1, 4, 3, 5), 2, dilation=(1, 2)), (3, 5), 2,
                               dilation=(1, 2))),
     (_rand(1, 4 * 6, 18),)),
    ("pad", lambda x: F.pad(x, (1, 2, 0, 3), value=-0.5), (_rand(1, 2, 3, 4),)),
    ("pad_negative", lambda x: (F.pad(x, (0, 0, 1, -1)), F.pad(x, (-1, 2, -2, 0), value=3.0), F.pad(x, (-2, -1))),
     (_rand(1, 2, 3, 4),)),  # a negative amount crops that side (RWKV's time shift)
    ("creation", lambda x: x + torch.full((2, 3), 2.5) + torch.zeros(3) + torch.ones(2, 1) + torch.arange(3)
     + torch.arange(1.0, 2.5, 0.5) + torch.zeros_like(x) + torch.full_like(x, 7) + torch.tensor(3.0), (_rand(2, 3),)),
    ("tril_triu", lambda x: torch.tril(x) + torch.triu(x, 1), (_rand(4, 5),)),
    ("matmuls", lambda a, b, c: (a @ b, torch.bmm(c, c.transpose(1, 2)), torch.matmul(c, b), a @ b[:, 0]),
     (_rand(3, 4), _rand(4, 5, seed=1), _rand(2, 3, 4, seed=2))),
    ("linear", lambda x, w, bias: F.linear(x, w, bias) + F.linear(x, w), (_rand(2, 3, 4), _rand(5, 4), _rand(5))),
    ("resize", lambda x: (F.interpolate(x, scale_factor=2, mode="nearest"), F.interpolate(x, size=(5, 7)),
                          F.interpolate(x, size=(5, 7), mode="bilinear"),
                          F.interpolate(x, scale_factor=1.5, mode="bilinear", align_corners=True)),
     (_rand(1, 2, 3, 4),)),
    ("pad_modes_roll_flip", lambda x: (F.pad(x, (1, 1, 2, 0), mode="reflect"), F.pad(x, (1, 1, 2, 0), mode="replicate"),
                                       torch.roll(x, 1, -1), torch.flip(x, [-1, 1])), (_rand(1, 2, 3, 4),)),
    ("topk_sort", lambda x: (*torch.topk(x, 2, dim=-1), *x.sort(-1, descending=True),
                             torch.topk(x, 3, dim=1, largest=False)[0]), (_rand(2, 4, 5),)),
    ("group_norm", lambda x: F.group_norm(x, 2, torch.arange(4.0) - 1, torch.arange(4.0) * 0.3) + F.group_norm(x, 4),
     (_rand(2, 4, 3, 5),)),
    # instance norm exports as a batch norm over the batch's own statistics (aten._native_batch_norm_legit.no_stats)
    ("instance_norm", lambda x, y, z: (F.instance_norm(x, weight=torch.arange(4.0) - 1, bias=torch.arange(4.0) * 0.3),
                                       F.instance_norm(y, eps=1e-3), F.instance_norm(z)),
     (_rand(2, 4, 3, 5) * 3 + 1, _rand(3, 2, 7), _rand(1, 2, 3, 4, 2))),
    ("batch_statistics_norm", lambda x, y: (
        F.batch_norm(x, None, None, torch.arange(3.0) + 0.5, torch.arange(3.0) - 1, training=True, eps=1e-3),
        F.batch_norm(y, None, None, training=True)), (_rand(4, 3, 5), _rand(6, 5) * 2 - 1)),
    ("weight_standardization", lambda x, w: F.conv2d(x, F.batch_norm(w.reshape(1, 6, -1), None, None, training=True,
                                                                      eps=1e-6).reshape_as(w), padding=1),
     (_rand(2, 3, 6, 6), _rand(6, 3, 3, 3, seed=1))),
    ("sdpa", lambda q, k, v: F.scaled_dot_product_attention(q, k, v) + F.scaled_dot_product_attention(
        q, k, v, is_causal=True), (_rand(2, 3, 5, 4), _rand(2, 3, 5, 4, seed=1), _rand(2, 3, 5, 4, seed=2))),
    ("sdpa_mask", lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m > 0),
     (_rand(1, 2, 4, 8), _rand(1, 2, 6, 8, seed=1), _rand(1, 2, 6, 8, seed=2), _rand(4, 6, seed=3).abs() - 0.5)),
]


def _assigned(x: Any, y: Any) -> Any:
    """In-place slice and row assignment (an exported graph's slice_scatter and select_scatter)."""
    x = x.clone()
    x[:, 1:4] = y
    x[1] = 0.5
    return x


def _masked(x: Any) -> Any:
    """``x[mask] = v`` with one value (an exported graph's index_put with a boolean index: a where)."""
    y = x.clone()
    y[y < 0] = 0.25
    y[:, 1:][x[:, 1:] > 0.5] = 1.0
    return y


@pytest.mark.parametrize("fn,inputs", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_op_matches_eager(fn: Callable[..., Any], inputs: tuple) -> None:
    _check(Fn(fn), inputs)


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, stride=2, padding=1)
        self.dw = nn.Conv2d(6, 6, 3, padding=2, dilation=2, groups=6, bias=False)
        self.bn = nn.BatchNorm2d(6)
        self.up = nn.ConvTranspose2d(6, 4, 3, stride=2, padding=1, output_padding=1)
        self.conv1d = nn.Conv1d(4, 2, 3)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x: Any) -> Any:
        y = self.bn(self.dw(self.conv(x)))
        y = F.max_pool2d(F.relu(y), 3, stride=1, padding=1) + F.avg_pool2d(y, 3, stride=1, padding=1)
        z = self.up(y)
        pooled = F.adaptive_avg_pool2d(z, 1).flatten(1) + F.adaptive_avg_pool2d(z, (2, 2)).mean((2, 3))
        seq = self.conv1d(z.flatten(2))
        return pooled, F.avg_pool2d(y, 2, ceil_mode=True, count_include_pad=False), seq


def test_convolution_pooling_batchnorm() -> None:
    torch.manual_seed(0)
    _check(ConvNet().eval(), (_rand(2, 3, 9, 9),))


@pytest.mark.parametrize("shape, size", [
    ((2, 3, 19, 14), (2, 2)),  # windows 10 rows each, overlapping on row 9
    ((1, 4, 8, 8), (7, 7)),  # VGG's pool on a 256x256 image's 8x8 features
    ((1, 2, 5, 9), (3, 4)),
    ((1, 2, 5, 6), (1, 4)),  # one axis divides, the other does not
    ((1, 2, 7), (3,)),
    ((1, 2, 5, 6, 7), (2, 3, 4)),
])
def test_adaptive_average_pooling_where_the_output_size_does_not_divide_the_input(shape: tuple[int, ...],
                                                                                  size: tuple[int, ...]) -> None:
    """torch's windows there are of unequal sizes and may overlap: each output cell averages its own window."""
    pool = {3: F.adaptive_avg_pool1d, 4: F.adaptive_avg_pool2d, 5: F.adaptive_avg_pool3d}[len(shape)]
    module = _check(Fn(lambda x: pool(x, size)), (_rand(*shape),))
    assert "avg_pool" not in {v.op for v in module.main.values()}
    got = cuvil.compile(Fn(lambda x: pool(x, size)), example_inputs=(_rand(*shape),), cache=False)(
        _rand(*shape, seed=1).numpy())
    np.testing.assert_allclose(got, pool(_rand(*shape, seed=1), size).numpy(), rtol=1e-5, atol=1e-6)


def test_layer_norm_with_and_without_affine() -> None:
    torch.manual_seed(0)
    ln = nn.LayerNorm([4, 5])
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-0.5, 0.5)
    _check(Fn(lambda x: ln(x) + F.layer_norm(x, (5,), eps=1e-3)), (_rand(2, 4, 5),))


def test_parameters_and_buffers_become_constants() -> None:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.arange(6.0).view(2, 3))
            self.register_buffer("shift", torch.tensor([1.0, -2.0, 3.0]))
            self.register_buffer("scale", torch.tensor(0.5), persistent=False)

        def forward(self, x: Any) -> Any:
            return (x @ self.w.t()) * self.scale + self.shift.sum() + torch.tensor([1.0, 2.0])

    module = _check(M(), (_rand(4, 3),))
    fn = module.main
    assert [p.name for p in fn.params] == ["x"]
    consts = [module.constant(v) for v in fn.values() if v.is_const]
    assert any(c.shape == (2, 3) and np.array_equal(c, np.arange(6.0, dtype=np.float32).reshape(2, 3))
               for c in consts)
    assert any(c.shape == (3,) and np.array_equal(c, np.array([1.0, -2.0, 3.0], np.float32)) for c in consts)


def test_output_names_follow_the_output_structure() -> None:
    m = Fn(lambda x: {"sum": x.sum(0), "double": x * 2})
    module = cuvil.import_model(m, (_rand(2, 3),))
    assert set(module.main.result_names) == {"sum", "double"}
    assert cuvil.import_model(Fn(lambda x: x + 1), (_rand(2),)).main.result_names == ("output",)
    assert cuvil.import_model(Fn(lambda x: (x, x + 1)), (_rand(2),)).main.result_names == ("out0", "out1")


def test_kwargs_inputs_become_named_params() -> None:
    class M(nn.Module):
        def forward(self, a: Any, b: Any) -> Any:
            return a - b

    module = cuvil.import_model(M(), {"a": _rand(2, 3), "b": _rand(2, 3, seed=1)})
    assert [p.name for p in module.main.params] == ["a", "b"]
    x, y = _rand(2, 3), _rand(2, 3, seed=9)
    out = cuvil.run_reference(module, {"a": x.numpy(), "b": y.numpy()})[0]
    np.testing.assert_allclose(out, (x - y).numpy(), rtol=1e-6)


# --------------------------------------------------------------------------------------
# dynamic dims


def test_dynamic_batch_becomes_a_constrained_symbol() -> None:
    Dim = torch.export.Dim
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 3)).eval()
    module = cuvil.import_model(model, (_rand(4, 8),), dynamic_shapes=({0: Dim("batch", min=1, max=32)},))
    fn = module.main
    assert fn.params[0].shape == (Sym.symbol("batch"), 8)
    assert fn.results[0].shape == (Sym.symbol("batch"), 3)
    c = fn.constraint("batch")
    assert (c.lo, c.hi) == (1, 32)
    for batch in (1, 7, 32):
        x = _rand(batch, 8, seed=batch)
        out = cuvil.run_reference(module, [x.numpy()])[0]
        with torch.no_grad():
            np.testing.assert_allclose(out, model(x).numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(cuvil.errors.ConstraintError):
        cuvil.run_reference(module, [np.zeros((33, 8), np.float32)])


def test_two_dynamic_dims_and_sizes_used_as_values() -> None:
    Dim = torch.export.Dim

    def f(x: Any, y: Any) -> Any:
        n, k = x.shape
        return x * n + k * 2 + y.view(n, k, 2).sum(-1) + torch.arange(k).float()

    class M(nn.Module):
        def forward(self, x: Any, y: Any) -> Any:
            return f(x, y)

    n_dim, k_dim = Dim("n"), Dim("k", max=100)
    module = cuvil.import_model(M(), (_rand(3, 4), _rand(3, 8)),
                                dynamic_shapes=({0: n_dim, 1: k_dim}, {0: n_dim, 1: 2 * k_dim}))
    fn = module.main
    assert [str(d) for d in fn.params[0].shape] == ["n", "k"]
    assert [str(d) for d in fn.params[1].shape] == ["n", "2*k"]
    assert fn.constraint("k").hi == 100
    assert fn.constraint("n").hi is None
    for n, k in ((2, 5), (6, 3)):
        x, y = _rand(n, k, seed=n), _rand(n, 2 * k, seed=k)
        out = cuvil.run_reference(module, [x.numpy(), y.numpy()])[0]
        np.testing.assert_allclose(out, f(x, y).numpy(), rtol=1e-5, atol=1e-5)


def test_dynamic_sequence_length_in_attention() -> None:
    Dim = torch.export.Dim
    torch.manual_seed(0)
    attn = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    class M(nn.Module):
        def forward(self, x: Any) -> Any:
            return attn(x, x, x, need_weights=False)[0]

    model = M()
    module = cuvil.import_model(model, (_rand(2, 5, 8),), dynamic_shapes=({1: Dim("seq", min=2, max=64)},))
    assert "seq" in module.main.symbols()
    for s in (3, 11):
        x = _rand(2, s, 8, seed=s)
        out = cuvil.run_reference(module, [x.numpy()])[0]
        with torch.no_grad():
            np.testing.assert_allclose(out, model(x).numpy(), rtol=1e-5, atol=1e-5)


def test_sympy_translation() -> None:
    import sympy
    from torch.utils._sympy.functions import FloorDiv, Max

    s, t = sympy.Symbol("s0", integer=True, positive=True), sympy.Symbol("s1", integer=True, positive=True)
    names = {s: "batch", t: "seq"}
    assert sympy_to_dim(2 * s * t + 3, names) == 2 * Sym.symbol("batch") * Sym.symbol("seq") + 3
    d = sympy_to_dim(FloorDiv(s - 1, 2) + 1, names)
    assert d.evaluate({"batch": 9}) == 5
    m = sympy_to_dim(Max(s, t), names)
    assert m.evaluate({"batch": 3, "seq": 7}) == 7
    with pytest.raises(UnsupportedOpError):
        sympy_to_dim(sympy.Symbol("u0") + 1, names)


# --------------------------------------------------------------------------------------
# ExportedProgram, .pt2, registry


def test_exported_program_and_pt2_file(tmp_path: Any) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(12, 2)).eval()
    x = _rand(1, 2, 4, 4)
    ep = torch.export.export(model, (x,))
    path = tmp_path / "model.pt2"
    torch.export.save(ep, str(path))
    with torch.no_grad():
        want = model(x).numpy()
    for source in (ep, path, str(path)):
        module = cuvil.import_model(source)
        np.testing.assert_allclose(cuvil.run_reference(module, [x.numpy()])[0], want, rtol=1e-5, atol=1e-6)


def test_registry_lists_converters_with_catalogue_ops() -> None:
    table = aten_converters()
    for name in ("aten.convolution.default", "aten.addmm.default", "aten.native_layer_norm.default",
                 "aten._native_batch_norm_legit_no_training.default", "aten._softmax.default",
                 "aten.max_pool2d_with_indices.default", "aten.embedding.default", "aten.index.Tensor",
                 "aten.arange.start_step", "aten.view.default"):
        assert name in table, name
        assert table[name].op_type == name
        assert table[name].domain == "aten"
    defined = {op.name for op in all_ops()} | {"const"}
    missing = sorted({f"{e.op_type} -> {op}" for e in table.values() for op in e.cir_ops if op not in defined})
    assert not missing, f"converters emit ops the catalogue lacks: {missing}"


def test_training_mode_is_restored_and_eval_semantics_used() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.BatchNorm1d(4)).train()
    model[0].eval()  # a mixed state must survive the import
    x = _rand(3, 4)
    module = cuvil.import_model(model, (x,))
    assert [m.training for m in model] == [False, True, True]
    model.eval()
    with torch.no_grad():
        np.testing.assert_allclose(cuvil.run_reference(module, [x.numpy()])[0], model(x).numpy(), rtol=1e-5,
                                   atol=1e-6)


# --------------------------------------------------------------------------------------
# errors


def test_unknown_aten_op_is_reported_with_its_node() -> None:
    model = Fn(lambda x: torch.fft.fft(x).real)
    with pytest.raises(UnsupportedOpError) as info:
        cuvil.import_model(model, (_rand(4, 8),))
    assert info.value.location is not None and "fft" in info.value.location
    assert info.value.code == "CUVIL-UNSUPPORTED-OP"


def test_as_strided_of_another_layout_is_refused() -> None:
    """A view of a transposed value reads memory in an order the graph does not describe."""
    model = Fn(lambda x: x.t().as_strided((2, 2), (1, 2)))
    with pytest.raises(UnsupportedOpError) as info:
        cuvil.import_model(model, (_rand(3, 4),))
    assert "row-major" in str(info.value)


def test_half_vector_norm_sums_in_float32() -> None:
    """A float16 sum of 64 squares of 300 overflows; torch sums in float32 and rounds the norm once."""
    x = torch.full((2, 64), 300.0, dtype=torch.float16)
    module = cuvil.import_model(Fn(lambda v: torch.linalg.vector_norm(v, dim=1)), (x,))
    (got,) = cuvil.run_reference(module, [x.numpy()])
    want = torch.linalg.vector_norm(x, dim=1).numpy()
    assert got.dtype == np.float16 and np.isfinite(want).all()
    np.testing.assert_array_equal(got, want)


def test_module_without_example_inputs() -> None:
    with pytest.raises(ModelLoadError):
        cuvil.import_model(nn.Linear(2, 2))


def test_unexportable_model_is_a_load_error() -> None:
    def branchy(x: Any) -> Any:
        if x.sum() > 0:  # data-dependent control flow cannot be exported
            return x + 1
        return x - 1

    with pytest.raises(ModelLoadError) as info:
        cuvil.import_model(Fn(branchy), (_rand(3),))
    assert "torch.export" in info.value.message


def test_unknown_option_and_bad_pt2() -> None:
    with pytest.raises(ModelLoadError):
        import_torch(Fn(lambda x: x), (_rand(2),), no_such_option=True)
    with pytest.raises(ModelLoadError):
        cuvil.import_model("/nonexistent/model.pt2")


def test_bad_pt2_contents(tmp_path: Any) -> None:
    path = tmp_path / "broken.pt2"
    path.write_bytes(b"not a zip archive")
    with pytest.raises(CuvilError):
        cuvil.import_model(path)


def test_boolean_mask_indexing_is_unsupported() -> None:
    with pytest.raises((UnsupportedOpError, ModelLoadError)):
        cuvil.import_model(Fn(lambda x: x[x > 0]), (_rand(5),))


def test_float64_model_keeps_its_dtype() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 3).to(torch.float64).eval()
    x = _rand(2, 4).double()
    module = _check(model, (x,))
    assert module.main.results[0].dtype.value == "f64"
    assert math.isclose(float(np.abs(cuvil.run_reference(module, [x.numpy()])[0]).sum()),
                        float(model(x).detach().abs().sum()), rel_tol=1e-9)
