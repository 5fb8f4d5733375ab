"""Random ONNX graphs compiled end to end (import, the O3 pipeline, the tuned kernels and their layouts) on one and
two threads, against ONNX Runtime; random PyTorch modules through ``torch.export``, against PyTorch eager.

Two generators draw the graphs from a seed: convolutional ones (convolutions of every geometry the kernels take:
kernels 1-7, strides, dilations, asymmetric pads, groups and depthwise, then ReLUs, max and average pools with
ceil mode, residual adds, concatenations, global pooling; batches of 1 and 2, planes up to 70 wide, a middle
value sometimes a second output) and sequence ones (linear layers, attention blocks, softmax and layer norm,
erf GELU, transposes, reductions, broadcast adds, slices and gathers). A schedule is chosen per shape and
thread count, and the layout between kernels per graph, so the graphs reach the combinations no hand-written
case names: a random graph found a producer in bands asked for its reader's padded layout, which failed the
compile on two threads. The two libraries must also give the same bits: the pool splits work, never a sum. The
PyTorch modules chain convolutions (depthwise, transposed), batch norms, max and adaptive average pools (output
sizes that do not divide the input's, which the importer once refused), eight activations, residual blocks,
upsampling and a linear head.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil.compiler import compile
from tests.oracles import assert_agrees, same_float32_bits

ort = pytest.importorskip("onnxruntime")


class _Graph:
    """An ONNX graph under construction: nodes, initializers and fresh names."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self) -> str:
        self.count += 1
        return f"t{self.count}"

    def const(self, array: np.ndarray | np.generic) -> str:
        n = self.name()
        self.inits.append(numpy_helper.from_array(np.asarray(array), n))
        return n

    def floats(self, *shape: int, scale: float = 0.5) -> str:
        return self.const((self.rng.standard_normal(shape) * scale).astype(np.float32))

    def node(self, op: str, inputs: list[str], **attrs: Any) -> str:
        out = self.name()
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def model(self, shape: tuple[int, ...], outputs: list[str]) -> onnx.ModelProto:
        def value(n: str) -> onnx.ValueInfoProto:
            return helper.make_tensor_value_info(n, TensorProto.FLOAT, None)

        graph = helper.make_graph(self.nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                                  [value(o) for o in outputs], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
        return onnx.shape_inference.infer_shapes(model)


def _pool_side(n: int, k: int, s: int, p: int, ceil: bool) -> int:
    """A pool's output extent as ONNX Runtime computes it (a ceil-mode window may not start in the end padding)."""
    out = (n + 2 * p - k + (s - 1 if ceil else 0)) // s + 1
    return out - 1 if ceil and (out - 1) * s >= n + p else out


def _cnn(rng: np.random.Generator) -> tuple[onnx.ModelProto, tuple[int, ...]]:
    n, c = int(rng.choice([1, 2])), int(rng.choice([3, 8, 16, 24, 32, 48]))
    wide = 70 if rng.random() < 0.35 else 40
    shape = [n, c, int(rng.integers(5, wide)), int(rng.integers(5, wide))]
    x_shape = tuple(shape)
    g = _Graph(rng)
    cur = "x"
    seen: list[tuple[str, list[int]]] = []
    for _ in range(int(rng.integers(2, 8))):
        kind = str(rng.choice(["conv", "conv", "conv", "max", "avg", "add", "relu", "concat", "global"]))
        if kind == "conv":
            co = int(rng.choice([8, 16, 17, 32, 48, 64]))
            kh = int(rng.choice([1, 3, 5, 7]))
            kw = kh if rng.random() < 0.8 else int(rng.choice([1, 3]))
            s, d = int(rng.choice([1, 1, 2])), 1 if rng.random() < 0.85 else 2
            pads = [int(rng.integers(0, kh)), int(rng.integers(0, kw))]
            pads += pads if rng.random() < 0.8 else [int(rng.integers(0, kh)), int(rng.integers(0, kw))]
            groups = co if rng.random() < 0.2 and shape[1] == co else 1
            oh = (shape[2] + pads[0] + pads[2] - d * (kh - 1) - 1) // s + 1
            ow = (shape[3] + pads[1] + pads[3] - d * (kw - 1) - 1) // s + 1
            if oh < 1 or ow < 1:
                continue
            w = g.floats(co, shape[1] // groups, kh, kw, scale=(shape[1] // groups * kh * kw) ** -0.5)
            cur = g.node("Conv", [cur, w, g.floats(co)], kernel_shape=[kh, kw], strides=[s, s], dilations=[d, d],
                         pads=pads, group=groups)
            shape = [n, co, oh, ow]
            if rng.random() < 0.5:
                cur = g.node("Relu", [cur])
        elif kind in ("max", "avg"):
            k, s = int(rng.choice([2, 3])), int(rng.choice([1, 2]))
            p, ceil = int(rng.integers(0, k // 2 + 1)), bool(rng.random() < 0.3)
            oh, ow = _pool_side(shape[2], k, s, p, ceil), _pool_side(shape[3], k, s, p, ceil)
            if oh < 1 or ow < 1:
                continue
            attrs: dict[str, Any] = {"kernel_shape": [k, k], "strides": [s, s], "pads": [p] * 4, "ceil_mode": int(ceil)}
            if kind == "avg":
                attrs["count_include_pad"] = int(rng.random() < 0.5)
            cur = g.node("MaxPool" if kind == "max" else "AveragePool", [cur], **attrs)
            shape = [n, shape[1], oh, ow]
        elif kind == "add":
            same = [t for t, sh in seen if sh == shape and t != cur]
            if not same:
                continue
            cur = g.node("Add", [cur, same[-1]])
        elif kind == "relu":
            cur = g.node("Relu", [cur])
        elif kind == "concat":
            beside = [(t, sh) for t, sh in seen if sh[0] == n and sh[2:] == shape[2:] and t != cur]
            if not beside:
                continue
            cur = g.node("Concat", [cur, beside[-1][0]], axis=1)
            shape = [n, shape[1] + beside[-1][1][1], *shape[2:]]
        elif len(seen) >= 2:
            cur = g.node("GlobalAveragePool", [cur])
            shape = [n, shape[1], 1, 1]
        seen.append((cur, list(shape)))
    outputs = [cur]
    if len(seen) > 2 and rng.random() < 0.3 and seen[len(seen) // 2][0] != cur:
        outputs.append(seen[len(seen) // 2][0])  # a middle value also an output
    return g.model(x_shape, outputs), x_shape


def _sequence(rng: np.random.Generator) -> tuple[onnx.ModelProto, tuple[int, ...]]:
    shape = [int(rng.choice([1, 2, 3])), int(rng.integers(1, 40)), int(rng.choice([4, 8, 16, 24, 32, 40, 64]))]
    x_shape = tuple(shape)
    g = _Graph(rng)
    cur = "x"
    for _ in range(int(rng.integers(2, 9))):
        kind = str(rng.choice(["linear", "linear", "softmax", "norm", "gelu", "attention", "transpose", "reduce",
                               "add", "slice", "gather"]))
        if kind == "linear":
            width = int(rng.choice([4, 8, 16, 33, 64, 96]))
            cur = g.node("MatMul", [cur, g.floats(shape[-1], width, scale=shape[-1] ** -0.5)])
            shape = [*shape[:-1], width]
            if rng.random() < 0.6:
                cur = g.node("Add", [cur, g.floats(width)])
        elif kind == "softmax":
            cur = g.node("Softmax", [cur], axis=int(rng.integers(-len(shape), len(shape))))
        elif kind == "norm":
            cur = g.node("LayerNormalization", [cur, g.floats(shape[-1]), g.floats(shape[-1])], axis=-1, epsilon=1e-5)
        elif kind == "gelu":
            inner = g.node("Add", [g.node("Erf", [g.node("Div", [cur, g.const(np.float32(2 ** 0.5))])]),
                                   g.const(np.float32(1.0))])
            cur = g.node("Mul", [g.node("Mul", [cur, inner]), g.const(np.float32(0.5))])
        elif kind == "attention" and len(shape) == 3:
            heads = int(rng.choice([h for h in (1, 2, 4) if shape[-1] % h == 0]))
            split = g.node("Reshape", [cur, g.const(np.asarray([*shape[:2], heads, shape[-1] // heads], np.int64))])
            q = g.node("Transpose", [split], perm=[0, 2, 1, 3])
            k = g.node("Transpose", [split], perm=[0, 2, 3, 1])
            scores = g.node("Mul", [g.node("MatMul", [q, k]), g.const(np.float32((shape[-1] // heads) ** -0.5))])
            heads_out = g.node("MatMul", [g.node("Softmax", [scores], axis=-1), q])
            cur = g.node("Reshape", [g.node("Transpose", [heads_out], perm=[0, 2, 1, 3]),
                                     g.const(np.asarray(shape, np.int64))])
        elif kind == "transpose":
            perm = [int(p) for p in rng.permutation(len(shape))]
            cur = g.node("Transpose", [cur], perm=perm)
            shape = [shape[p] for p in perm]
        elif kind == "reduce":
            axis = int(rng.integers(0, len(shape)))
            op = str(rng.choice(["ReduceMean", "ReduceSum", "ReduceMax"]))
            cur = g.node(op, [cur, g.const(np.asarray([axis], np.int64))], keepdims=1)
            shape[axis] = 1
        elif kind == "add":
            cur = g.node("Add", [cur, g.floats(*[d if rng.random() < 0.5 else 1 for d in shape])])
        elif kind == "slice":
            axis = int(rng.integers(0, len(shape)))
            if shape[axis] < 2:
                continue
            start = int(rng.integers(0, shape[axis] - 1))
            end, step = int(rng.integers(start + 1, shape[axis] + 1)), int(rng.choice([1, 1, 2]))
            cur = g.node("Slice", [cur, *(g.const(np.asarray([v], np.int64)) for v in (start, end, axis, step))])
            shape[axis] = len(range(start, end, step))
        elif kind == "gather":
            axis = int(rng.integers(0, len(shape)))
            index = rng.integers(-shape[axis], shape[axis], size=int(rng.integers(1, 5))).astype(np.int64)
            cur = g.node("Gather", [cur, g.const(index)], axis=axis)
            shape[axis] = index.size
    return g.model(x_shape, [cur]), x_shape


GENERATORS: dict[str, Callable[[np.random.Generator], tuple[onnx.ModelProto, tuple[int, ...]]]] = {
    "cnn": _cnn, "sequence": _sequence}


def _check(kind: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    model, shape = GENERATORS[kind](rng)
    x = rng.standard_normal(shape).astype(np.float32)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    _one_and_two_threads(lambda threads: compile(model, threads=threads, cache=False), x,
                         [np.asarray(y) for y in session.run(None, {"x": x})])


def _one_and_two_threads(build: Callable[[int], Any], x: np.ndarray, want: list[np.ndarray]) -> None:
    """The library ``build(threads)`` makes on one thread agrees with ``want`` on ``x``; on two, with it bit for bit."""
    one, two = (build(threads).run([x]) for threads in (1, 2))
    assert_agrees(one, want)
    assert all(same_float32_bits(a, b) for a, b in zip(two, one, strict=True)), "two threads changed a bit"


@pytest.mark.parametrize("kind", sorted(GENERATORS))
@pytest.mark.parametrize("seed", range(8))
def test_random_graphs_agree_with_onnx_runtime(kind: str, seed: int) -> None:
    _check(kind, seed)


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(GENERATORS))
@pytest.mark.parametrize("seed", range(8, 200))
def test_more_random_graphs_agree_with_onnx_runtime(kind: str, seed: int) -> None:
    _check(kind, seed)


def _torch_module(seed: int) -> tuple[Any, Any]:
    """A random convolutional ``nn.Module`` (eval mode, batch norms with drawn statistics) and its input."""
    torch = pytest.importorskip("torch")
    nn = torch.nn
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    channels = int(rng.choice([1, 3, 8]))
    layers: list[tuple[str, Any]] = []
    c = channels
    for _ in range(int(rng.integers(1, 6))):
        kind = str(rng.choice(["conv", "depthwise", "transposed", "norm", "max", "adaptive", "act", "residual", "up"]))
        if kind == "conv":
            k, co = int(rng.choice([1, 3, 5])), int(rng.choice([4, 8, 16, 24]))
            m = nn.Conv2d(c, co, k, int(rng.choice([1, 2])), k // 2, bias=bool(rng.random() < 0.7))
            c = co
        elif kind == "depthwise":
            m = nn.Conv2d(c, c, 3, 1, 1, groups=c)
        elif kind == "transposed":
            co = int(rng.choice([4, 8]))
            m, c = nn.ConvTranspose2d(c, co, 2, 2), co
        elif kind == "norm":
            m = nn.BatchNorm2d(c)
            with torch.no_grad():
                m.running_mean.normal_()
                m.running_var.uniform_(0.5, 2.0)
                m.weight.normal_()
                m.bias.normal_()
        elif kind == "max":
            m = nn.MaxPool2d(int(rng.choice([2, 3])), 2, int(rng.integers(0, 2)), ceil_mode=bool(rng.random() < 0.3))
        elif kind == "adaptive":
            m = nn.AdaptiveAvgPool2d(int(rng.choice([1, 2, 3, 5])))
        elif kind == "act":
            m = [nn.ReLU(), nn.GELU(), nn.SiLU(), nn.Hardswish(), nn.Sigmoid(), nn.LeakyReLU(0.1), nn.ReLU6(),
                 nn.Tanh()][int(rng.integers(0, 8))]
        elif kind == "residual":
            m = nn.Conv2d(c, c, 3, 1, 1)
        else:
            m = nn.Upsample(scale_factor=2, mode=str(rng.choice(["nearest", "bilinear"])))
        layers.append((kind, m))
    head = nn.Linear(c, 5) if rng.random() < 0.5 else None

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.kinds = [k for k, _ in layers]
            self.layers = nn.ModuleList(m for _, m in layers)
            self.head = head

        def forward(self, x: Any) -> Any:
            for kind, m in zip(self.kinds, self.layers, strict=True):
                x = x + torch.relu(m(x)) if kind == "residual" else m(x)
            return x if self.head is None else self.head(x.mean(dim=(2, 3)))

    shape = (int(rng.choice([1, 2])), channels, int(rng.integers(8, 40)), int(rng.integers(8, 40)))
    return Net().eval(), torch.randn(*shape)


def _check_torch(seed: int) -> None:
    torch = pytest.importorskip("torch")
    module, x = _torch_module(seed)
    with torch.no_grad():
        want = module(x).numpy()
    _one_and_two_threads(lambda threads: compile(module, example_inputs=(x,), threads=threads, cache=False),
                         x.numpy(), [want])


@pytest.mark.parametrize("seed", range(6))
def test_random_torch_modules_agree_with_pytorch(seed: int) -> None:
    _check_torch(seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6, 150))
def test_more_random_torch_modules_agree_with_pytorch(seed: int) -> None:
    _check_torch(seed)
