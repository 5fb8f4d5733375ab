"""``torch.compile(model, backend="cuvil")``: Dynamo's graphs are compiled by Cuvil and match eager on the
zoo and on tiny Hugging Face models; a new shape compiles a new signature, an in-place weight update
recompiles, options reach cuvil.compile, and a second compilation of the same graph hits the cache."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import cuvil  # noqa: E402
from bench.models import ZOO_SMALL  # noqa: E402
from cuvil.errors import InputError  # noqa: E402
from cuvil.torch_backend import CompiledGraph, cuvil_backend  # noqa: E402


def _close(got, want, tol: float = 1e-4) -> None:  # type: ignore[no-untyped-def]
    got, want = (np.asarray(t.detach().numpy(), dtype=np.float64) for t in (got, want))
    scale = max(float(np.max(np.abs(want))), 1e-30)
    assert got.shape == want.shape and float(np.max(np.abs(got - want))) <= tol * scale


class _Graphs:
    """The backend, recording the graphs it was given."""

    def __init__(self, **options: object) -> None:
        self.graphs: list[CompiledGraph] = []
        self.options = options

    def __call__(self, gm, example_inputs):  # type: ignore[no-untyped-def]
        graph = cuvil_backend(gm, example_inputs, options=self.options)
        assert isinstance(graph, CompiledGraph)
        self.graphs.append(graph)
        return graph


@pytest.fixture(autouse=True)
def _fresh_dynamo():  # type: ignore[no-untyped-def]
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name", sorted(n for n, m in ZOO_SMALL.items() if m.has_torch_reference))
def test_zoo_models_match_eager(name: str) -> None:
    entry = ZOO_SMALL[name]
    model = entry.build().eval()
    backend = _Graphs(cache=False)
    compiled = torch.compile(model, backend=backend)
    inputs = entry.example_inputs()
    with torch.no_grad():
        got, want = compiled(*inputs), model(*inputs)
    _close(got[0] if isinstance(got, tuple) else got, want[0] if isinstance(want, tuple) else want)
    assert backend.graphs and all(g.compiled for g in backend.graphs)  # Cuvil ran, not a fallback


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "t5", "vit"])
def test_tiny_hugging_face_models_match_eager(name: str) -> None:
    """The tiny models of test_hf_models (built from configs, eager attention), every output leaf."""
    pytest.importorskip("transformers")
    from tests.frontend.test_hf_models import _build

    model, inputs = _build(name)
    backend = _Graphs(cache=False)
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        got, want = compiled(**inputs), model(**inputs)
    leaves = [(g, w) for g, w in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want),
                                     strict=True) if isinstance(w, torch.Tensor)]
    assert leaves
    for g, w in leaves:
        _close(g, w)
    assert backend.graphs and all(g.compiled for g in backend.graphs)


def test_the_backend_is_found_by_name() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.GELU()).eval()
    x = torch.randn(3, 6)
    with torch.no_grad():
        _close(torch.compile(model, backend="cuvil", options={"cache": False})(x), model(x))


def test_new_shapes_and_updated_weights_compile_again() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.ReLU()).eval()
    backend = _Graphs(cache=False)
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for batch in (2, 4, 4):
            x = torch.randn(batch, 5)
            _close(compiled(x), model(x))
        model[0].weight.mul_(-2.0)  # an in-place update: the bound weights are stale
        x = torch.randn(4, 5)
        _close(compiled(x), model(x))
    signatures = sum(len(g.compiled) for g in backend.graphs)
    assert signatures >= 3  # batch 2, batch 4, and batch 4 after the update


def test_options_reach_the_compiler_and_a_second_compilation_hits_the_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()).eval()
    x = torch.randn(2, 8)
    infos = []
    for _ in range(2):
        torch._dynamo.reset()
        backend = _Graphs(opt_level=1)
        with torch.no_grad():
            _close(torch.compile(model, backend=backend)(x), model(x))
        infos.append(backend.graphs[0].last.cache_info)
    assert infos[0].get("cache") == "miss" and infos[1].get("cache") == "hit"


def test_unknown_options_are_named() -> None:
    with pytest.raises(InputError, match="unknown options"):
        cuvil_backend(torch.fx.symbolic_trace(torch.nn.ReLU()), [], options={"opt": 3})


def test_compiling_a_module_without_example_inputs_says_how_to_give_them() -> None:
    with pytest.raises(cuvil.CuvilError, match="example inputs") as caught:
        cuvil.compile(torch.nn.Linear(2, 2))
    assert "example_inputs=" in caught.value.hint and "backend='cuvil'" in caught.value.hint
