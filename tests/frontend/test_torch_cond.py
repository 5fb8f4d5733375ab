"""``torch.cond`` from ``torch.export`` becomes one CIR ``cond``: results match eager PyTorch (an
oracle only) on inputs taking each branch, through the interpreter and compiled code, nested conds and
a dynamic batch dim included."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import cuvil  # noqa: E402
from cuvil.frontend.dispatch import import_model  # noqa: E402
from cuvil.interp import run_reference  # noqa: E402


class Branchy(torch.nn.Module):
    """Two results from either branch; the else-branch holds a cond of its own."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 4)
        self.scale = torch.nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def then(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.relu(self.lin(x)), x * self.scale

        def other(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            inner = torch.cond(x.max() > 1.0, lambda y: y * 2.0, lambda y: torch.tanh(y), (x,))
            return x - 1.0, inner

        return torch.cond(x.sum() > 0, then, other, (x,))


def _inputs(batch: int) -> list[np.ndarray]:
    rng = np.random.default_rng(batch)
    x = rng.standard_normal((batch, 4)).astype(np.float32)
    return [np.abs(x) + 0.1, -np.abs(x) * 0.1, -np.abs(x) + np.where(np.arange(4) == 0, 3.0, 0.0).astype(np.float32)]


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_cond_matches_eager_on_every_branch(dynamic: bool) -> None:
    model = Branchy().eval()
    shapes = {"x": {0: torch.export.Dim("batch", min=1, max=16)}} if dynamic else None
    ep = torch.export.export(model, (torch.randn(3, 4),), dynamic_shapes=shapes)
    module = import_model(ep)
    assert sum(v.op == "cond" for v in module.main.ops()) == 2  # the outer cond's two results
    compiled = cuvil.compile(module, cache=False)
    for batch in ((2, 5) if dynamic else (3,)):
        for x in _inputs(batch):
            with torch.no_grad():
                want = [t.numpy() for t in model(torch.from_numpy(x))]
            got = run_reference(module, {"x": x})
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
            for c, g in zip(compiled.run({"x": x}), got, strict=True):
                np.testing.assert_allclose(c, g, rtol=1e-5, atol=1e-6)
