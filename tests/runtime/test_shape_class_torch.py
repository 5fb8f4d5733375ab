"""A PyTorch model exported with ``torch.export.Dim`` ranges compiles to one library for the whole
range: the Dims' bounds are the shape class (no ``dim_max`` needed), and every shape in it matches
eager PyTorch (the oracle); a shape outside is refused before native code runs."""

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
