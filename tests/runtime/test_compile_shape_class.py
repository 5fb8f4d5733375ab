"""Shape-class libraries through ``cuvil.compile``: a PyTorch model exported with ``torch.export.Dim``
ranges compiles to one library for the whole range (the Dims' bounds are the shape class, no
``dim_max`` needed), every shape in it matches eager PyTorch (the oracle) and a shape outside is
refused before native code runs; the artifact cache keys a class by its largest dims."""

from __future__ import annotations

import numpy as np
import pytest

import cuvil
from cuvil.errors import ConstraintError

torch = pytest.importorskip("torch", reason="the model is a torch module")


class _Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = torch.nn.Linear(16, 8)
        self.k = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k = torch.relu(self.q(x)), self.k(x)
        return (q @ k.transpose(1, 2)).softmax(-1) @ k


def test_torch_export_dims_are_the_shape_class() -> None:
    torch.manual_seed(0)
    model = _Attention().eval()
    batch, seq = torch.export.Dim("batch", min=1, max=8), torch.export.Dim("seq", min=2, max=64)
    compiled = cuvil.compile(model, example_inputs=(torch.randn(2, 5, 16),), dynamic_shapes=({0: batch, 1: seq},),
                             shape_class=True, cache=False)
    man = compiled.manifest
    assert man is not None and man["shape_class"]["maxima"] == {"batch": 8, "seq": 64}
    for shape in ((1, 2, 16), (8, 64, 16), (3, 17, 16)):
        x = torch.randn(*shape)
        with torch.no_grad():
            want = model(x).numpy()
        np.testing.assert_allclose(compiled(x.numpy()), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ConstraintError, match="seq=65"):
        compiled(np.zeros((1, 65, 16), np.float32))


def test_a_shape_class_library_is_cached_by_its_largest_dims() -> None:
    """The cache key holds the class's maxima: the same request hits, a larger class is its own library,
    and a specialization of the same model never serves a request for the class."""
    from cuvil.ir.builder import Builder
    from cuvil.ir.dtypes import DType

    b = Builder()
    x = b.param("x", DType.f32, ["N", 4])
    module = b.module(b.function("f", [x], [b.relu(x)], ["y"]))
    first = cuvil.compile(module, shape_class=True, dim_max={"N": 8})
    again = cuvil.compile(module, shape_class=True, dim_max={"N": 8})
    larger = cuvil.compile(module, shape_class=True, dim_max={"N": 16})
    special = cuvil.compile(module, input_shapes={"x": (3, 4)}, dynamic=False)
    assert (first.cache_info["cache"], again.cache_info["cache"]) == ("miss", "hit")
    assert larger.cache_info["cache"] == "miss" and larger.manifest["shape_class"]["maxima"] == {"N": 16}
    assert special.cache_info["cache"] == "miss" and "shape_class" not in special.manifest
    assert len({m.cache_info["key"] for m in (first, larger, special)}) == 3
    np.testing.assert_array_equal(larger(-np.ones((12, 4), np.float32)), np.zeros((12, 4), np.float32))
