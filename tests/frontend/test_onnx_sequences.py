"""Sequences and optionals resolved at import: models built from seeded random pieces, run by
the interpreter and compiled, compared with onnx's reference evaluator (an oracle only), and the
forms a run feeds (sequence lengths, element shapes, present or empty optionals) each imported
on its own."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from cuvil.errors import InputError, UnsupportedOpError, UnsupportedOpsetError
from cuvil.frontend.onnx_import import import_onnx
from cuvil.frontend.onnx_structure import STRUCTURE_KEY, InputForm
from cuvil.onnx_backend import CuvilBackend

F = TensorProto.FLOAT


def _seq_type(elem: int = F, shape: list[Any] | None = None) -> onnx.TypeProto:
    return helper.make_sequence_type_proto(helper.make_tensor_type_proto(elem, shape))


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
           opset: int = 18, inits: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs,
                              [numpy_helper.from_array(a, n) for n, a in (inits or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _same(got: Any, want: Any) -> None:
    if want is None:
        assert got is None
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _same(g, w)
    else:
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
        assert np.asarray(got).dtype == np.asarray(want).dtype


def _check(model: onnx.ModelProto, feeds: dict[str, Any], modes: tuple[str, ...] = ("interpreter", "compiled")) -> None:
    want = ReferenceEvaluator(model).run(None, feeds)
    for mode in modes:
        options = {"opt_level": 1, "passes": "O0"} if mode == "compiled" else {}
        got = CuvilBackend.prepare(model, mode=mode, **options).run(feeds)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _same(g, w)


def _split_map_concat(axis: int, split: np.ndarray | None, keepdims: int, new_axis: int) -> onnx.ModelProto:
    """x -> SplitToSequence -> SequenceMap(relu(e) * 2 + bias) -> ConcatFromSequence."""
    body = helper.make_graph(
        [helper.make_node("Relu", ["e"], ["r"]),
         helper.make_node("Add", ["r", "r"], ["d"]),
         helper.make_node("Add", ["d", "bias"], ["o"])],
        "body", [helper.make_tensor_value_info("e", F, None), helper.make_tensor_value_info("bias", F, None)],
        [helper.make_tensor_value_info("o", F, None)])
    split_in = ["x", "split"] if split is not None else ["x"]
    nodes = [helper.make_node("SplitToSequence", split_in, ["s"], axis=axis, keepdims=keepdims),
             helper.make_node("SequenceMap", ["s", "bias"], ["m"], body=body),
             helper.make_node("ConcatFromSequence", ["m"], ["y"], axis=axis, new_axis=new_axis)]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [4, 6, 5]),
                          helper.make_tensor_value_info("bias", F, [1])],
                  [helper.make_tensor_value_info("y", F, None)],
                  inits={"split": split} if split is not None else None)


@pytest.mark.parametrize("axis,split,keepdims,new_axis", [
    (0, None, 1, 0), (1, None, 0, 1), (2, np.array(2, np.int64), 1, 0), (1, np.array([1, 3, 2], np.int64), 1, 0),
    (-1, None, 0, 1), (1, np.array(4, np.int64), 1, 0)])
def test_split_map_concat_matches_the_reference(axis: int, split: np.ndarray | None, keepdims: int,
                                                new_axis: int) -> None:
    rng = np.random.default_rng(7 + axis)
    feeds = {"x": rng.standard_normal((4, 6, 5)).astype(np.float32),
             "bias": rng.standard_normal(1).astype(np.float32)}
    _check(_split_map_concat(axis, split, keepdims, new_axis), feeds)


def _edit_model() -> onnx.ModelProto:
    """A fed sequence edited at static positions (negative ones included); its length feeds arithmetic."""
    nodes = [helper.make_node("SequenceInsert", ["seq", "t", "minus1"], ["s1"]),
             helper.make_node("SequenceErase", ["s1", "zero"], ["s2"]),
             helper.make_node("SequenceAt", ["s2", "minus1"], ["last"]),
             helper.make_node("SequenceLength", ["s2"], ["n"]),
             helper.make_node("Cast", ["n"], ["nf"], to=F),
             helper.make_node("Mul", ["last", "nf"], ["y"]),
             helper.make_node("Identity", ["s2"], ["out_seq"])]
    return _model(nodes, [helper.make_value_info("seq", _seq_type(F)),
                          helper.make_tensor_value_info("t", F, [3])],
                  [helper.make_tensor_value_info("y", F, None), helper.make_value_info("out_seq", _seq_type(F))],
                  inits={"minus1": np.array(-1, np.int64), "zero": np.array(0, np.int64)})


@pytest.mark.parametrize("length", [1, 2, 5])
def test_a_fed_sequence_is_imported_for_its_length(length: int) -> None:
    rng = np.random.default_rng(length)
    seq = [rng.standard_normal(3).astype(np.float32) for _ in range(length)]
    _check(_edit_model(), {"seq": seq, "t": rng.standard_normal(3).astype(np.float32)})


def test_each_form_is_imported_once_and_runs_agree() -> None:
    rep = CuvilBackend.prepare(_edit_model())
    rng = np.random.default_rng(0)
    t = rng.standard_normal(3).astype(np.float32)
    for length in (2, 3, 2):
        rep.run({"seq": [rng.standard_normal(3).astype(np.float32) for _ in range(length)], "t": t})
    assert len(rep._cache) == 2  # one import per length


def test_elements_of_different_shapes_stay_apart() -> None:
    """Each element of a fed sequence has its own shape; a body mapped over them sees each one."""
    body = helper.make_graph([helper.make_node("Shape", ["e"], ["s"])], "body",
                             [helper.make_tensor_value_info("e", F, None)],
                             [helper.make_tensor_value_info("s", TensorProto.INT64, None)])
    model = _model([helper.make_node("SequenceMap", ["images"], ["shapes"], body=body)],
                   [helper.make_value_info("images", _seq_type(F, ["H", "W"]))],
                   [helper.make_value_info("shapes", _seq_type(TensorProto.INT64))])
    rng = np.random.default_rng(1)
    _check(model, {"images": [rng.standard_normal(s).astype(np.float32) for s in ((2, 3), (5, 1), (4, 4))]})


def _optional_model() -> onnx.ModelProto:
    """y = x * 2 when the optional holds x, else a constant; also hands the optional back."""
    then = helper.make_graph([helper.make_node("OptionalGetElement", ["opt"], ["x"]),
                              helper.make_node("Add", ["x", "x"], ["r"])], "then", [],
                             [helper.make_tensor_value_info("r", F, None)])
    other = helper.make_graph([helper.make_node("Constant", [], ["r"], value=numpy_helper.from_array(
        np.full(4, -1.0, np.float32)))], "else", [], [helper.make_tensor_value_info("r", F, None)])
    opt_type = helper.make_optional_type_proto(helper.make_tensor_type_proto(F, [4]))
    nodes = [helper.make_node("OptionalHasElement", ["opt"], ["has"]),
             helper.make_node("If", ["has"], ["y"], then_branch=then, else_branch=other),
             helper.make_node("Identity", ["opt"], ["back"])]
    return _model(nodes, [helper.make_value_info("opt", opt_type)],
                  [helper.make_tensor_value_info("y", F, None), helper.make_value_info("back", opt_type)])


@pytest.mark.parametrize("present", [True, False])
def test_an_optional_input_chooses_its_branch(present: bool) -> None:
    """(onnx's reference evaluator cannot hand an empty optional through Identity: the expected
    values are written out.)"""
    x = np.arange(4, dtype=np.float32) if present else None
    for mode in ("interpreter", "compiled"):
        options = {"opt_level": 1, "passes": "O0"} if mode == "compiled" else {}
        got = CuvilBackend.prepare(_optional_model(), mode=mode, **options).run({"opt": x})
        np.testing.assert_array_equal(got[0], x * 2 if x is not None else np.full(4, -1.0, np.float32))
        if x is None:
            assert got[1] is None
        else:
            np.testing.assert_array_equal(got[1], x)


def test_forms_of_the_outputs_are_recorded_and_the_flat_module_is_plain_cir() -> None:
    model = _edit_model()
    module = import_onnx(model, input_forms={"seq": InputForm(shapes=((3,), (3,)))})
    assert [p.name for p in module.main.params] == ["seq.0", "seq.1", "t"]
    assert list(module.main.result_names[1:]) == ["out_seq.0", "out_seq.1"]
    assert module.metadata[STRUCTURE_KEY] == '{"out_seq": 2}'


def test_a_sequence_input_without_its_form_is_a_clear_error() -> None:
    with pytest.raises(InputError, match="sequence: its form") as e:
        import_onnx(_edit_model())
    assert e.value.hint and "onnx_backend" in e.value.hint


@pytest.mark.parametrize("position", [3, -4])
def test_a_position_outside_the_sequence_is_refused(position: int) -> None:
    model = _model([helper.make_node("SequenceConstruct", ["a", "b", "a"], ["s"]),
                    helper.make_node("SequenceAt", ["s", "p"], ["y"])],
                   [helper.make_tensor_value_info("a", F, [2]), helper.make_tensor_value_info("b", F, [2])],
                   [helper.make_tensor_value_info("y", F, None)], inits={"p": np.array(position, np.int64)})
    with pytest.raises(UnsupportedOpError, match=f"position {position} is outside a sequence of 3"):
        import_onnx(model)


def test_a_sequence_where_a_tensor_is_required_names_the_input() -> None:
    model = _model([helper.make_node("SequenceConstruct", ["a"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
                   [helper.make_tensor_value_info("a", F, [2])], [helper.make_tensor_value_info("y", F, None)])
    with pytest.raises(UnsupportedOpError, match="input 0 is a sequence, where a tensor is required"):
        import_onnx(model)


def test_a_position_fed_at_run_time_is_bound_per_value() -> None:
    """A position given as a graph input is needed at import: the backend imports per its value."""
    model = _model([helper.make_node("SequenceConstruct", ["a", "b"], ["s"]),
                    helper.make_node("SequenceAt", ["s", "p"], ["y"])],
                   [helper.make_tensor_value_info("a", F, [2]), helper.make_tensor_value_info("b", F, [2]),
                    helper.make_tensor_value_info("p", TensorProto.INT64, [])],
                   [helper.make_tensor_value_info("y", F, None)])
    a, b = np.ones(2, np.float32), np.full(2, 2.0, np.float32)
    for p in (0, 1, -1):
        _check(model, {"a": a, "b": b, "p": np.array(p, np.int64)}, modes=("interpreter",))


# --------------------------------------------------------------------------------------
# older opsets, batch statistics, power-of-two casts


def test_an_old_opset_imports_when_its_ops_mean_the_same() -> None:
    model = _model([helper.make_node("Not", ["x"], ["y"])], [helper.make_tensor_value_info("x", TensorProto.BOOL, [3])],
                   [helper.make_tensor_value_info("y", TensorProto.BOOL, [3])], opset=1)
    _check(model, {"x": np.array([True, False, True])})


def test_an_old_opset_whose_op_changed_is_refused_naming_it() -> None:
    b = TensorProto.BOOL
    model = _model([helper.make_node("Add", ["x", "x"], ["y"]), helper.make_node("Not", ["b"], ["c"])],
                   [helper.make_tensor_value_info("x", F, [3]), helper.make_tensor_value_info("b", b, [3])],
                   [helper.make_tensor_value_info("y", F, [3]), helper.make_tensor_value_info("c", b, [3])],
                   opset=5)
    with pytest.raises(UnsupportedOpsetError, match="opset 5 is not supported for Add: their definitions changed"):
        import_onnx(model)


@pytest.mark.parametrize("shape,momentum", [((2, 3, 4, 5), 0.9), ((4, 2), 0.5), ((1, 3, 7), 0.0)])
def test_batch_norm_training_mode_uses_the_batch_statistics(shape: tuple[int, ...], momentum: float) -> None:
    rng = np.random.default_rng(len(shape))
    c = shape[1]
    inits = {"scale": rng.uniform(0.5, 1.5, c).astype(np.float32), "bias": rng.standard_normal(c).astype(np.float32),
             "mean": rng.standard_normal(c).astype(np.float32), "var": rng.uniform(0.5, 2, c).astype(np.float32)}
    node = helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y", "rm", "rv"],
                            training_mode=1, momentum=momentum, epsilon=1e-3)
    model = _model([node], [helper.make_tensor_value_info("x", F, list(shape))],
                   [helper.make_tensor_value_info(n, F, None) for n in ("y", "rm", "rv")], opset=15, inits=inits)
    _check(model, {"x": (3 * rng.standard_normal(shape) + 1).astype(np.float32)})


@pytest.mark.parametrize("mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [0, 1])
def test_power_of_two_casts_round_as_asked(mode: str, saturate: int) -> None:
    x = np.array([0.0, 1e-40, 0.1, 0.75, 1.0, 1.5, 3.0, 5.9, 2.0 ** 100, 3e38, np.nan, np.inf], np.float32)
    model = _model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT8E8M0, round_mode=mode,
                                     saturate=saturate)],
                   [helper.make_tensor_value_info("x", F, [x.size])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT8E8M0, [x.size])], opset=24)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0].view(np.uint8)
    defined = np.ones(x.size, bool)
    defined[11] = False  # +inf: checked against the specification's table below
    defined[1] = False  # a float32 subnormal: the reference's bit arithmetic reads its exponent as 2**-126
    if not saturate:  # non-saturating casts of zero and of what is out of range are NaN or unspecified
        defined[[0, 9]] = False
    for mode_ in ("interpreter", "compiled"):
        options = {"opt_level": 1, "passes": "O0"} if mode_ == "compiled" else {}
        got = np.asarray(CuvilBackend.prepare(model, mode=mode_, **options).run({"x": x})[0]).view(np.uint8)
        np.testing.assert_array_equal(got[defined], want[defined])
        if saturate:  # Cast's table: saturating, +inf becomes E8M0_MAX (onnx's reference evaluator gives NaN)
            assert got[11] == 254


@pytest.mark.parametrize("fed,kind,message", [
    ([np.zeros(1, np.float32)] * 5000, "sequence", "longer than"),
    (None, "sequence", "cannot be None"),
    (np.zeros(3, np.float32), "sequence", "takes a list of arrays"),
])
def test_hostile_forms_of_a_sequence_input_are_clear_errors(fed: Any, kind: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        InputForm.of(fed, kind)


def test_a_list_fed_where_an_optional_holds_a_tensor_is_refused() -> None:
    rep = CuvilBackend.prepare(_optional_model())
    with pytest.raises(InputError, match="holds a tensor, got a list"):
        rep.run({"opt": [np.zeros(4, np.float32)]})
