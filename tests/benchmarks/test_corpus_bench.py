"""``python -m bench.corpus``: Cuvil against ONNX Runtime on the test corpus's real models, interleaved."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bench.corpus import _corpus, bench_entry


def test_the_corpus_list_is_the_tests_own() -> None:
    corpus = _corpus()
    names = [e.name for e in corpus.CORPUS]
    assert len(names) == len(set(names)) >= 10 and "ppocr-det" in names


def test_an_entry_runs_both_engines_on_its_first_shapes(tmp_path) -> None:
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 5)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 5])], [w])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    entry = SimpleNamespace(name="tiny", kind="a matmul", exporter="onnx.helper", shapes=({"x": (3, 8)}, {"x": (1, 8)}),
                            statics={})
    row = bench_entry(entry, str(path), threads=1, repeat=4, warmup=1)
    assert row["model"] == "tiny" and row["cuvil_ms"] > 0 and row["ort_ms"] > 0
    assert row["ratio"] == row["cuvil_ms"] / row["ort_ms"]

