"""Composite and control-flow ONNX converters (attention, recurrences, losses, If/Loop/Scan, ...)
checked against ONNX Runtime as the oracle, on shapes with distinct dims and on variants
the node conformance cases do not cover."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import cuvil.onnx_backend as backend
from cuvil.errors import UnsupportedOpError

ort = pytest.importorskip("onnxruntime")

F32 = TensorProto.FLOAT
I64 = TensorProto.INT64
RNG = np.random.default_rng(1234)


def _model(nodes: list[onnx.NodeProto], inputs: list[tuple[str, int, list | None]], outputs: list[str],
           opset: int = 22, initializers: list[onnx.TensorProto] = ()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [onnx.ValueInfoProto(name=n) for n in outputs],
                              initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], rtol: float = 1e-5, atol: float = 1e-6) -> None:
    got = backend.run_model(model, feeds)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def _randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# --------------------------------------------------------------------------------------
# control flow


@pytest.mark.parametrize("cond", [True, False])
def test_if_inlines_the_selected_branch_with_outer_scope_names(cond: bool) -> None:
    then_g = helper.make_graph([helper.make_node("Add", ["x", "x"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", F32, [2, 3])])
    else_g = helper.make_graph([helper.make_node("Mul", ["x", "y"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", F32, [2, 3])])
    model = _model([helper.make_node("If", ["c"], ["out"], then_branch=then_g, else_branch=else_g)],
                   [("c", TensorProto.BOOL, []), ("x", F32, [2, 3]), ("y", F32, [3])], ["out"])
    _check(model, {"c": np.array(cond), "x": _randn(2, 3), "y": _randn(3)})


def test_loop_unrolls_a_static_trip_count_with_carried_and_scan_outputs() -> None:
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Cast", ["i"], ["i_f"], to=F32),
         helper.make_node("Mul", ["x", "i_f"], ["step"]),
         helper.make_node("Add", ["acc_in", "step"], ["acc_out"]),
         helper.make_node("Identity", ["acc_out"], ["trace"])],
        "body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", F32, [2, 3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", F32, [2, 3]), helper.make_tensor_value_info("trace", F32, [2, 3])])
    trip = helper.make_tensor("trip", I64, [], [4])
    model = _model([helper.make_node("Loop", ["trip", "", "acc0"], ["acc", "traces"], body=body)],
                   [("acc0", F32, [2, 3]), ("x", F32, [2, 3])], ["acc", "traces"], initializers=[trip])
    _check(model, {"acc0": _randn(2, 3), "x": _randn(2, 3)})


def test_scan_with_reverse_input_and_output_axis() -> None:
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "e"], ["s_out"]), helper.make_node("Mul", ["s_out", "e"], ["o"])],
        "body", [helper.make_tensor_value_info("s_in", F32, [3]), helper.make_tensor_value_info("e", F32, [3])],
        [helper.make_tensor_value_info("s_out", F32, [3]), helper.make_tensor_value_info("o", F32, [3])])
    model = _model([helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1,
                                     scan_input_axes=[1], scan_input_directions=[1], scan_output_axes=[1])],
                   [("s0", F32, [3]), ("xs", F32, [3, 5])], ["s", "ys"], opset=16)
    _check(model, {"s0": _randn(3), "xs": _randn(3, 5)})


def test_dropout_is_identity_with_an_all_true_mask() -> None:
    model = _model([helper.make_node("Dropout", ["x", "r", "t"], ["y", "m"])],
                   [("x", F32, [3, 4]), ("r", F32, []), ("t", TensorProto.BOOL, [])], ["y", "m"])
    x = _randn(3, 4)
    y, m = backend.run_model(model, {"x": x, "r": np.array(0.3, np.float32), "t": np.array(False)})
    np.testing.assert_array_equal(y, x)
    assert m.dtype == np.bool_ and m.shape == x.shape and m.all()
    with pytest.raises(UnsupportedOpError, match="random"):
        backend.run_model(model, {"x": x, "r": np.array(0.3, np.float32), "t": np.array(True)})


# --------------------------------------------------------------------------------------
# attention


@pytest.mark.parametrize("causal, with_past, mask",
                         list(itertools.product([0, 1], [False, True], [None, "bool", "float"])))
def test_attention_gqa_against_onnxruntime(causal: int, with_past: bool, mask: str | None) -> None:
    b, hq, hkv, sq, skv, past, d, dv = 2, 6, 2, 3, 5, 4, 8, 7
    total = skv + (past if with_past else 0)
    names = ["q", "k", "v", "mask" if mask else "", "pk" if with_past else "", "pv" if with_past else ""]
    while names[-1] == "":
        names.pop()
    ins = [("q", F32, [b, hq, sq, d]), ("k", F32, [b, hkv, skv, d]), ("v", F32, [b, hkv, skv, dv])]
    feeds = {"q": _randn(b, hq, sq, d), "k": _randn(b, hkv, skv, d), "v": _randn(b, hkv, skv, dv)}
    if mask == "bool":
        m = RNG.random((sq, total)) > 0.3
        m[:, 0] = True  # every row keeps a key (a fully masked row is covered by the node cases)
        ins.append(("mask", TensorProto.BOOL, [sq, total]))
        feeds["mask"] = m
    elif mask == "float":
        ins.append(("mask", F32, [b, 1, sq, total]))
        feeds["mask"] = _randn(b, 1, sq, total)
    outs = ["y"]
    if with_past:
        ins += [("pk", F32, [b, hkv, past, d]), ("pv", F32, [b, hkv, past, dv])]
        feeds |= {"pk": _randn(b, hkv, past, d), "pv": _randn(b, hkv, past, dv)}
        outs += ["present_k", "present_v"]
    model = _model([helper.make_node("Attention", names, outs, is_causal=causal, softcap=3.0)], ins, outs, opset=23)
    _check(model, feeds, rtol=1e-4, atol=1e-5)


def test_attention_3d_scaled_matches_a_numpy_formula() -> None:
    b, s, heads, d = 2, 4, 3, 5
    q, k, v = _randn(b, s, heads * d), _randn(b, s + 2, heads * d), _randn(b, s + 2, heads * d)
    model = _model([helper.make_node("Attention", ["q", "k", "v"], ["y"], q_num_heads=heads, kv_num_heads=heads,
                                     scale=0.25)],
                   [("q", F32, [b, s, heads * d]), ("k", F32, [b, s + 2, heads * d]),
                    ("v", F32, [b, s + 2, heads * d])], ["y"], opset=23)
    (y,) = backend.run_model(model, [q, k, v])

    def split(t: np.ndarray) -> np.ndarray:
        return t.reshape(b, -1, heads, d).transpose(0, 2, 1, 3).astype(np.float64)

    logits = split(q) @ split(k).transpose(0, 1, 3, 2) * 0.25
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = (p @ split(v)).transpose(0, 2, 1, 3).reshape(b, s, heads * d)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("interleaved, rot_dim", [(0, 0), (1, 0), (0, 4), (1, 4)])
def test_rotary_embedding_against_onnxruntime(interleaved: int, rot_dim: int) -> None:
    b, h, s, d, maxpos = 2, 3, 5, 8, 11
    half = (rot_dim or d) // 2
    model = _model([helper.make_node("RotaryEmbedding", ["x", "c", "s", "p"], ["y"], interleaved=interleaved,
                                     rotary_embedding_dim=rot_dim)],
                   [("x", F32, [b, h, s, d]), ("c", F32, [maxpos, half]), ("s", F32, [maxpos, half]),
                    ("p", I64, [b, s])], ["y"], opset=23)
    angles = RNG.random((maxpos, half)).astype(np.float32) * 3
    _check(model, {"x": _randn(b, h, s, d), "c": np.cos(angles), "s": np.sin(angles),
                   "p": RNG.integers(0, maxpos, (b, s)).astype(np.int64)})


# --------------------------------------------------------------------------------------
# recurrences


def _recurrent_case(op: str, gates: int, direction: str, layout: int, with_lens: bool,
                    **attrs: object) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    seq, batch, inp, hidden = 4, 3, 5, 6
    dirs = 2 if direction == "bidirectional" else 1
    xs = [seq, batch, inp] if layout == 0 else [batch, seq, inp]
    hs = [dirs, batch, hidden] if layout == 0 else [batch, dirs, hidden]
    feeds = {"X": _randn(*xs), "W": _randn(dirs, gates * hidden, inp) * 0.5,
             "R": _randn(dirs, gates * hidden, hidden) * 0.5, "B": _randn(dirs, 2 * gates * hidden) * 0.1,
             "lens": np.array([4, 2, 3], np.int32) if with_lens else None, "h0": _randn(*hs)}
    ins = [("X", F32, xs), ("W", F32, list(feeds["W"].shape)), ("R", F32, list(feeds["R"].shape)),
           ("B", F32, list(feeds["B"].shape))]
    names = ["X", "W", "R", "B", "lens" if with_lens else "", "h0"]
    if with_lens:
        ins.append(("lens", TensorProto.INT32, [batch]))
    ins.append(("h0", F32, hs))
    outs = ["Y", "Y_h"]
    if op == "LSTM":
        feeds["c0"] = _randn(*hs)
        feeds["P"] = _randn(dirs, 3 * hidden) * 0.3
        names += ["c0", "P"]
        ins += [("c0", F32, hs), ("P", F32, [dirs, 3 * hidden])]
        outs.append("Y_c")
    feeds = {k: v for k, v in feeds.items() if v is not None}
    node = helper.make_node(op, names, outs, hidden_size=hidden, direction=direction, layout=layout, **attrs)
    return _model([node], ins, outs), feeds


@pytest.mark.parametrize("op, gates, attrs", [
    ("RNN", 1, {}),
    ("RNN", 1, {"activations": ["Relu", "Tanh"], "clip": 1.5}),
    ("GRU", 3, {}),
    ("GRU", 3, {"linear_before_reset": 1}),
    ("LSTM", 4, {}),
    ("LSTM", 4, {"input_forget": 1, "clip": 2.0}),
])
@pytest.mark.parametrize("direction, layout, with_lens", [("forward", 0, False), ("reverse", 1, True),
                                                          ("bidirectional", 0, True)])
def test_recurrences_against_onnxruntime(op: str, gates: int, attrs: dict, direction: str, layout: int,
                                         with_lens: bool) -> None:
    if "activations" in attrs:
        per_dir = attrs["activations"][:1]
        attrs = {**attrs, "activations": per_dir * (2 if direction == "bidirectional" else 1)}
    model, feeds = _recurrent_case(op, gates, direction, 0, with_lens, **attrs)
    if layout == 0:
        _check(model, feeds, rtol=1e-4, atol=1e-5)
        return
    # onnxruntime has no batch-first layout: compare with its sequence-first result, transposed
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)
    batch_first, _ = _recurrent_case(op, gates, direction, 1, with_lens, **attrs)
    swapped = {k: (v.transpose(1, 0, 2) if k in ("X", "h0", "c0") else v) for k, v in feeds.items()}
    got = backend.run_model(batch_first, swapped)
    np.testing.assert_allclose(got[0], want[0].transpose(2, 0, 1, 3), rtol=1e-4, atol=1e-5)
    for g, w in zip(got[1:], want[1:], strict=True):
        np.testing.assert_allclose(g, w.transpose(1, 0, 2), rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------------------
# losses


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted, ignore", [(False, None), (True, None), (True, 2), (False, -1)])
def test_softmax_cross_entropy_against_onnxruntime(reduction: str, weighted: bool, ignore: int | None) -> None:
    n, c, d = 4, 5, 3
    labels = RNG.integers(0, c, (n, d)).astype(np.int64)
    if ignore is not None:
        labels[0, 0] = ignore
    names = ["scores", "labels"] + (["w"] if weighted else [])
    attrs = {"reduction": reduction} | ({"ignore_index": ignore} if ignore is not None else {})
    ins = [("scores", F32, [n, c, d]), ("labels", I64, [n, d])] + ([("w", F32, [c])] if weighted else [])
    model = _model([helper.make_node("SoftmaxCrossEntropyLoss", names, ["loss", "logp"], **attrs)], ins,
                   ["loss", "logp"], opset=13)
    feeds = {"scores": _randn(n, c, d), "labels": labels}
    if weighted:
        feeds["w"] = RNG.random(c).astype(np.float32)
    _check(model, feeds, rtol=1e-5, atol=1e-6)


def test_nll_loss_matches_a_numpy_formula() -> None:
    n, c = 6, 4
    logp = np.log(RNG.random((n, c)).astype(np.float32))
    target = RNG.integers(0, c, n).astype(np.int64)
    target[1] = 3
    w = RNG.random(c).astype(np.float32)
    model = _model([helper.make_node("NegativeLogLikelihoodLoss", ["x", "t", "w"], ["loss"], ignore_index=3)],
                   [("x", F32, [n, c]), ("t", I64, [n]), ("w", F32, [c])], ["loss"], opset=13)
    (loss,) = backend.run_model(model, [logp, target, w])
    keep = target != 3
    wt = w[target] * keep
    want = -(logp[np.arange(n), target] * wt).sum() / wt.sum()
    np.testing.assert_allclose(loss, want, rtol=1e-5)


# --------------------------------------------------------------------------------------
# small composites


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_det_matches_numpy(n: int) -> None:
    x = _randn(2, 3, n, n)
    model = _model([helper.make_node("Det", ["x"], ["d"])], [("x", F32, [2, 3, n, n])], ["d"])
    (d,) = backend.run_model(model, [x])
    np.testing.assert_allclose(d, np.linalg.det(x.astype(np.float64)), rtol=1e-4, atol=1e-5)


def test_max_unpool_inverts_max_pool_indices() -> None:
    pool = helper.make_node("MaxPool", ["x"], ["p", "i"], kernel_shape=[2, 2], strides=[2, 2])
    unpool = helper.make_node("MaxUnpool", ["p", "i"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
    x = _randn(2, 3, 4, 6)
    sess = ort.InferenceSession(_model([pool], [("x", F32, [2, 3, 4, 6])], ["p", "i"]).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    p, i = sess.run(None, {"x": x})
    model = _model([unpool], [("p", F32, list(p.shape)), ("i", I64, list(i.shape))], ["y"])
    _check(model, {"p": p, "i": i})


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows_against_onnxruntime(op: str, periodic: int) -> None:
    size = helper.make_tensor("n", I64, [], [10])
    model = _model([helper.make_node(op, ["n"], ["w"], periodic=periodic)], [], ["w"], opset=17,
                   initializers=[size])
    _check(model, {}, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("length", [6, 8, 11])
@pytest.mark.parametrize("inverse, onesided, complex_in", [(0, 0, False), (0, 1, False), (0, 0, True), (1, 0, True)])
def test_dft_pads_or_truncates_like_numpy_fft(length: int, inverse: int, onesided: int, complex_in: bool) -> None:
    x = _randn(2, 8, 3, 2 if complex_in else 1)
    axis = helper.make_tensor("axis", I64, [], [1])
    n = helper.make_tensor("n", I64, [], [length])
    model = _model([helper.make_node("DFT", ["x", "n", "axis"], ["y"], inverse=inverse, onesided=onesided)],
                   [("x", F32, list(x.shape))], ["y"], opset=20, initializers=[axis, n])
    (y,) = backend.run_model(model, [x])
    signal = x[..., 0] + 1j * x[..., 1] if complex_in else x[..., 0]
    want = (np.fft.ifft if inverse else np.fft.fft)(signal.astype(np.complex128), n=length, axis=1)
    if onesided:
        want = want[:, : length // 2 + 1]
    np.testing.assert_allclose(y, np.stack([want.real, want.imag], axis=-1), rtol=1e-5, atol=1e-5)


def test_inverse_onesided_dft_is_numpy_irfft() -> None:
    spectrum = np.fft.rfft(RNG.standard_normal((2, 10)), axis=1)
    x = np.stack([spectrum.real, spectrum.imag], axis=-1).astype(np.float32)
    model = _model([helper.make_node("DFT", ["x"], ["y"], axis=1, inverse=1, onesided=1)],
                   [("x", F32, list(x.shape))], ["y"], opset=19)
    (y,) = backend.run_model(model, [x])
    np.testing.assert_allclose(y[..., 0], np.fft.irfft(spectrum, n=10, axis=1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("size", [[2, 3, 4, 5], [2, 1, 3, 4, 5]])
def test_affine_grid_against_onnxruntime(align: int, size: list[int]) -> None:
    k = len(size) - 2
    shape = helper.make_tensor("size", I64, [len(size)], size)
    model = _model([helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=align)],
                   [("theta", F32, [2, k, k + 1])], ["grid"], opset=20, initializers=[shape])
    _check(model, {"theta": _randn(2, k, k + 1)}, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter_writes_at_each_batch_entry_index(mode: str) -> None:
    past, update = _randn(3, 2, 6, 4), _randn(3, 2, 3, 4)
    where = np.array([0, 2, 5 if mode == "circular" else 3], np.int64)
    model = _model([helper.make_node("TensorScatter", ["past", "update", "idx"], ["present"], mode=mode)],
                   [("past", F32, [3, 2, 6, 4]), ("update", F32, [3, 2, 3, 4]), ("idx", I64, [3])], ["present"],
                   opset=24)
    (got,) = backend.run_model(model, [past, update, where])
    want = past.copy()
    for bi in range(3):
        for s in range(3):
            want[bi, :, (where[bi] + s) % 6] = update[bi, :, s]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("t", [0, 3])
def test_adam_step_matches_its_formula(t: int) -> None:
    x, g, v, h = _randn(5), _randn(5), _randn(5), RNG.random(5).astype(np.float32)
    node = helper.make_node("Adam", ["r", "t", "x", "g", "v", "h"], ["x2", "v2", "h2"],
                            domain="ai.onnx.preview.training", alpha=0.8, beta=0.9, epsilon=1e-3, norm_coefficient=0.1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("r", F32, []),
                                            helper.make_tensor_value_info("t", I64, [])] +
                              [helper.make_tensor_value_info(n, F32, [5]) for n in "xgvh"],
                              [onnx.ValueInfoProto(name=n) for n in ("x2", "v2", "h2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx.preview.training", 1)])
    got = backend.run_model(model, [np.array(0.05, np.float32), np.array(t, np.int64), x, g, v, h])
    gr = 0.1 * x.astype(np.float64) + g
    v2 = 0.8 * v + 0.2 * gr
    h2 = 0.9 * h + 0.1 * gr * gr
    rate = 0.05 * np.sqrt(1 - 0.9**t) / (1 - 0.8**t) if t > 0 else 0.05
    x2 = x - rate * v2 / (np.sqrt(h2) + 1e-3)
    for out, want in zip(got, (x2, v2, h2), strict=True):
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_causal_conv_with_state_matches_a_direct_convolution() -> None:
    b, c, length, k = 2, 3, 5, 4
    x, w, bias, past = _randn(b, c, length), _randn(c, 1, k), _randn(c), _randn(b, c, k - 1)
    model = _model([helper.make_node("CausalConvWithState", ["x", "w", "bias", "past"], ["y", "state"],
                                     activation="silu")],
                   [("x", F32, [b, c, length]), ("w", F32, [c, 1, k]), ("bias", F32, [c]),
                    ("past", F32, [b, c, k - 1])], ["y", "state"], opset=27)
    y, state = backend.run_model(model, [x, w, bias, past])
    full = np.concatenate([past, x], axis=2).astype(np.float64)
    conv = np.stack([(full[:, :, t:t + k] * w[:, 0]).sum(-1) for t in range(length)], axis=-1) + bias[:, None]
    np.testing.assert_allclose(y, conv / (1 + np.exp(-conv)), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(state, full[:, :, -(k - 1):].astype(np.float32))


def test_linear_attention_gated_delta_gqa_matches_the_recurrence() -> None:
    b, t, hq, hkv, dk, dv = 2, 3, 4, 2, 3, 5
    q, k, v = _randn(b, t, hq * dk), _randn(b, t, hkv * dk), _randn(b, t, hkv * dv)
    decay, beta = -RNG.random((b, t, hkv)).astype(np.float32), RNG.random((b, t, hkv)).astype(np.float32)
    model = _model([helper.make_node("LinearAttention", ["q", "k", "v", "", "g", "beta"], ["y", "s"],
                                     q_num_heads=hq, kv_num_heads=hkv)],
                   [("q", F32, [b, t, hq * dk]), ("k", F32, [b, t, hkv * dk]), ("v", F32, [b, t, hkv * dv]),
                    ("g", F32, [b, t, hkv]), ("beta", F32, [b, t, hkv])], ["y", "s"], opset=27)
    y, s = backend.run_model(model, [q, k, v, decay, beta])
    state = np.zeros((b, hkv, dk, dv))
    outs = np.zeros((b, t, hq, dv))
    for i in range(t):
        kt, vt = k[:, i].reshape(b, hkv, dk), v[:, i].reshape(b, hkv, dv)
        state = state * np.exp(decay[:, i])[:, :, None, None]
        vt = beta[:, i][:, :, None] * (vt - np.einsum("bhdm,bhd->bhm", state, kt))
        state = state + kt[..., :, None] * vt[..., None, :]
        outs[:, i] = np.einsum("bhd,bhdm->bhm", q[:, i].reshape(b, hq, dk), np.repeat(state, hq // hkv, axis=1))
    np.testing.assert_allclose(y, (outs / np.sqrt(dk)).reshape(b, t, hq * dv), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(s, state, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_against_onnxruntime(mode: str, padding: str, align: int) -> None:
    x = _randn(2, 3, 4, 5)
    grid = (RNG.random((2, 6, 7, 2)) * 3.2 - 1.6).astype(np.float32)  # reaches past the borders
    model = _model([helper.make_node("GridSample", ["x", "grid"], ["y"], mode=mode, padding_mode=padding,
                                     align_corners=align)],
                   [("x", F32, [2, 3, 4, 5]), ("grid", F32, [2, 6, 7, 2])], ["y"], opset=22)
    _check(model, {"x": x, "grid": grid}, rtol=1e-4, atol=1e-5)


def test_col2im_with_strides_pads_and_dilations_against_onnxruntime() -> None:
    image, block = helper.make_tensor("image", I64, [2], [7, 6]), helper.make_tensor("block", I64, [2], [2, 3])
    # padded 9 x 8; blocks span 3 x 5 (dilations 2, 2); strides 2, 1 -> 4 x 4 locations
    model = _model([helper.make_node("Col2Im", ["x", "image", "block"], ["y"], strides=[2, 1], dilations=[2, 2],
                                     pads=[1, 0, 1, 2])],
                   [("x", F32, [2, 3 * 6, 16])], ["y"], opset=18, initializers=[image, block])
    _check(model, {"x": _randn(2, 18, 16)})
