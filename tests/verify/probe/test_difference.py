"""Difference bounds between a program and the same program perturbed at some values hold: on single catalogue
ops in float32, float16 and bfloat16 (random and corner inputs in the box, random and extreme perturbations
within each source's bound, the rule and the fast path) and on tiny transformers with perturbed matmul
outputs; shared values have difference exactly 0 and a broken transfer rule is caught."""

from __future__ import annotations

import functools
import importlib.util
import sys
import zlib
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from test_bounds_catalogue import _box, _is_float, _sample, _table

from cuvil.errors import CuvilError
from cuvil.interp import evaluate_op
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Function, Module
from cuvil.ir.opdef import OpDef, get_op
from cuvil.ir.specialize import bind_attr
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value
from verify.probe import difference
from verify.probe.difference import DifferenceBounds, difference_bounds
from verify.probe.interval import Interval

FLOATS = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}
INDEX_OPS = frozenset({"gather", "gather_elements", "embedding"})
"""Ops whose integer operand is read as data indices: it becomes an input with a box."""
SOURCE_RELATIVE = 0.02
SOURCE_ABSOLUTE = 0.002
LARGEST = 1e3


# --------------------------------------------------------------------------------------
# single ops


@dataclass
class OpCase:
    """One catalogue op as a function ``op(reshape(x_k), ...)`` whose reshapes of the perturbed operands are
    the sources, with the box and source bound of every input."""

    op: OpDef
    attrs: dict[str, Any]
    out_type: TensorType
    arrays: list[np.ndarray]
    boxes: dict[int, Interval]
    bounds: dict[int, np.ndarray]
    fn: Function
    module: Module
    sources: dict[Value, Callable[..., np.ndarray]]

    @property
    def ranges(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        return {f"x{k}": (b.lo, b.hi) for k, b in self.boxes.items()}

    def bound(self, **options: Any) -> DifferenceBounds:
        return difference_bounds(self.fn, self.module.constants, self.ranges, self.sources, **options)


def _convert(arrays: list[np.ndarray], dtype: str) -> list[np.ndarray]:
    """Float operands in ``dtype``, their non-finite and huge elements (overflow cases) brought into range."""
    out = []
    for a in arrays:
        if _is_float(a):
            x = a.astype(np.float64)
            a = np.clip(np.where(np.isfinite(x), x, 0.0), -LARGEST, LARGEST).astype(FLOATS[dtype])
        out.append(a)
    return out


def _source(bound: np.ndarray) -> Callable[..., np.ndarray]:
    return lambda *hulls: bound


def make_case(name: str, example: int, dtype: str, only_first: bool, scale: float = 1.0) -> OpCase:
    """A catalogue example in ``dtype`` with its float operands perturbed (``only_first``: the first one, the
    others constants), each within ``scale`` times a bound relative to the example's values."""
    op = get_op(name)
    raw, attrs = _table()[(name, example)]
    arrays = _convert(raw, dtype)
    full = op.check_attrs(attrs)
    out_type = op.infer([TensorType(DType.from_numpy(a.dtype), a.shape) for a in arrays], full)
    floats = [k for k, a in enumerate(arrays) if _is_float(a)]
    perturbed = floats[:1] if only_first else floats
    b = Builder()
    operands, params = [], []
    boxes: dict[int, Interval] = {}
    bounds: dict[int, np.ndarray] = {}
    sources: dict[Value, Callable[..., np.ndarray]] = {}
    for k, a in enumerate(arrays):
        if k not in perturbed and not (name in INDEX_OPS and not _is_float(a)):
            operands.append(b.const(a))
            continue
        x = b.param(f"x{k}", DType.from_numpy(a.dtype), a.shape)
        params.append(x)
        if k in perturbed:
            boxes[k] = _box(a)
            bounds[k] = scale * (SOURCE_RELATIVE * np.abs(a.astype(np.float64)) + SOURCE_ABSOLUTE)
            x = b.reshape(x, shape=a.shape)
            sources[x] = _source(bounds[k])
        else:
            boxes[k] = Interval(np.full(a.shape, float(a.min())), np.full(a.shape, float(a.max())))
        operands.append(x)
    fn = b.function("main", params, [b.op(name, *operands, **full)])
    return OpCase(op, full, out_type, arrays, boxes, bounds, fn, b.module(fn), sources)


@functools.cache
def catalogue_cases() -> list[tuple[str, int, str]]:
    """Up to two examples of every op with a float operand (one per target type for casts), in each float
    type where the op accepts it."""
    out: list[tuple[str, int, str]] = []
    for dtype in FLOATS:
        seen: Counter[str] = Counter()
        for (name, k), (arrays, attrs) in _table().items():
            key = f"cast to {attrs['to']}" if name == "cast" else name
            if seen[key] >= (1 if name == "cast" else 2) or name in ("fused", "loop") or \
                    not any(_is_float(a) for a in arrays):
                continue
            try:
                make_case(name, k, dtype, only_first=False)
            except CuvilError:  # the op does not take this type (an attribute or operand pins it)
                continue
            seen[key] += 1
            out.append((name, k, dtype))
    return out


def _nudge(x: np.ndarray, bound: np.ndarray, rng: np.random.Generator, corner: bool) -> np.ndarray:
    """``x`` moved by at most ``bound`` in its own type (to the ends of the allowed range on corners)."""
    step = np.where(rng.random(x.shape) < 0.5, -1.0, 1.0) if corner else rng.uniform(-1.0, 1.0, x.shape)
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore"):
        moved = (x64 + step * bound).astype(x.dtype)
    toward = np.nextafter(moved, x)
    for candidate in (toward, x):
        moved = np.where(np.abs(moved.astype(np.float64) - x64) > bound, candidate, moved)
    return moved


def _gaps(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``|q - p|`` where both are finite (0 elsewhere: the bound assumes finite values)."""
    a, b = p.astype(np.float64), q.astype(np.float64)
    ok = np.isfinite(a) & np.isfinite(b)
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(ok, np.abs(b - a), 0.0)


def _outside(y: np.ndarray, hull: Interval) -> np.ndarray:
    y = y.astype(np.float64)
    return np.isfinite(y) & ((y < hull.lo) | (y > hull.hi))


def check_case(case: OpCase, rng: np.random.Generator, trials: int = 12, **options: Any) -> float:
    """Both programs on random inputs in the box stay within the bound (and in the hull); returns the largest
    ratio of a difference seen to its bound."""
    res = case.bound(**options)
    y = case.fn.results[0]
    shape = tuple(int(d) for d in case.out_type.shape)
    bound = np.broadcast_to(res.values[y], shape)
    hull = res.hulls[y]
    worst = 0.0
    for t in range(trials):
        corner = t % 3 == 0
        xs = [_sample(case.boxes[k], a.dtype, rng, corner) if k in case.boxes else a
              for k, a in enumerate(case.arrays)]
        us = [_nudge(x, case.bounds[k], rng, corner) if k in case.bounds else x for k, x in enumerate(xs)]
        for fast in (True, False):
            p = evaluate_op(case.op, xs, case.attrs, case.out_type, use_fast_path=fast)
            q = evaluate_op(case.op, us, case.attrs, case.out_type, use_fast_path=fast)
            gap = _gaps(p, q)
            bad = gap > bound
            assert not bad.any(), (f"{case.op.name}: |P' - P| = {gap[bad][0]!r} > {bound[bad][0]!r} at "
                                   f"{tuple(np.argwhere(bad)[0])} ({'fast path' if fast else 'rule'})")
            for z in (p, q):
                assert not _outside(z, hull).any(), f"{case.op.name}: a value left its hull"
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(bound > 0, gap / bound, 0.0)
            worst = max(worst, float(np.max(ratio, initial=0.0)))
    return worst


@pytest.mark.parametrize("name,example,dtype", catalogue_cases(), ids=lambda x: str(x))
def test_catalogue_op_differences_hold(name: str, example: int, dtype: str) -> None:
    """Every float operand perturbed, and the first alone with the others constant."""
    rng = np.random.default_rng(zlib.crc32(f"{name}/{example}/{dtype}".encode()))
    every = make_case(name, example, dtype, only_first=False)
    check_case(every, rng)
    if len(every.sources) > 1:  # the first float operand perturbed, the others constants
        check_case(make_case(name, example, dtype, only_first=True), rng)


REQUIRED_OPS = ("add", "mul", "div", "exp", "tanh", "sigmoid", "gelu", "silu", "relu", "softmax", "layer_norm",
                "reduce_sum", "reduce_mean", "matmul", "conv", "gather", "embedding", "transpose", "reshape", "concat",
                "slice", "where", "max_pool", "rsqrt", "sqrt", "leaky_relu", "pow", "cast")


def test_catalogue_cases_cover_the_ops_of_transformers_in_every_type() -> None:
    covered = {(name, dtype) for name, _, dtype in catalogue_cases()}
    missing = [(n, d) for n in REQUIRED_OPS for d in FLOATS if (n, d) not in covered]
    assert not missing, missing


@pytest.mark.parametrize("name", ["matmul", "conv", "einsum"])
@pytest.mark.parametrize("dtype", list(FLOATS))
def test_sums_of_products_through_the_fast_path_hold(name: str, dtype: str) -> None:
    """Contractions with a constant and with a perturbed second operand, their bound taken through the op's
    own fast path."""
    examples = [k for n, k, d in catalogue_cases() if n == name and d == dtype]
    assert examples
    for k in examples:
        for only_first in (True, False):
            case = make_case(name, k, dtype, only_first)
            rng = np.random.default_rng(k)
            check_case(case, rng, fast_path_min=0)
            fast, rule = (case.bound(fast_path_min=m).values[case.fn.results[0]] for m in (0, 1 << 40))
            assert np.all(np.isfinite(fast)) and np.all(fast > 0)
            assert np.all(fast <= 2 * rule + 1e-6), "the fast path is much looser than the rule"


@pytest.mark.parametrize("name", ["layer_norm", "softmax", "matmul", "max_pool", "gather"])
def test_a_rule_read_in_blocks_gives_the_same_bounds(name: str) -> None:
    """A grid budget smaller than the op's grid splits its rule into blocks of output indices."""
    case = make_case(name, 0, "f32", only_first=False)
    y = case.fn.results[0]
    whole, blocks = (case.bound(budget=b, fast_path_min=1 << 40) for b in (1 << 22, 8))
    assert np.array_equal(np.broadcast_to(whole.values[y], blocks.values[y].shape), blocks.values[y])
    assert np.array_equal(whole.hulls[y].lo, blocks.hulls[y].lo) and np.array_equal(whole.hulls[y].hi,
                                                                                      blocks.hulls[y].hi)


def test_a_data_dependent_index_reads_the_largest_difference_in_its_range() -> None:
    """A gather whose ids come from the input: the bound at each output is the largest source bound over the
    rows the ids may select, not infinity."""
    b = Builder()
    table = b.param("t", DType.f32, (4, 3))
    ids = b.param("i", DType.i64, (2,))
    moved = b.reshape(table, shape=(4, 3))
    y = b.gather(moved, ids, axis=0)
    fn = b.function("main", [table, ids], [y])
    rows = np.array([[1.0], [2.0], [3.0], [4.0]]) * 1e-3
    res = difference_bounds(fn, b.constants, {"t": (-1.0, 1.0), "i": (1, 2)}, {moved: lambda h: rows})
    assert np.allclose(res.output(), 3e-3)


def test_a_condition_decided_by_its_hull_keeps_the_branch_difference() -> None:
    """``where(x > 0, x, 0)`` with a perturbed ``x``: where the hull of ``x`` is positive both programs take the
    first branch; where the condition may flip, either branch's value may be taken (the hull's width)."""
    b = Builder()
    x = b.param("x", DType.f32, (8,))
    moved = b.reshape(x, shape=(8,))
    zero = b.const(np.zeros(8, dtype=np.float32))
    y = b.where(b.greater(moved, zero), moved, zero)
    fn = b.function("main", [x], [y])
    sources = {moved: lambda h: np.array(1e-3)}
    assert np.allclose(difference_bounds(fn, b.constants, {"x": (0.5, 1.0)}, sources).output(), 1e-3, rtol=1e-9)
    either = difference_bounds(fn, b.constants, {"x": (-1.0, 1.0)}, sources).output()
    assert np.allclose(either, 2.002)


def test_zero_sources_leave_every_difference_exactly_zero() -> None:
    for name, k, dtype in catalogue_cases()[::3]:
        case = make_case(name, k, dtype, only_first=False, scale=0.0)
        res = case.bound()
        assert all(not np.any(d) for d in res.values.values()), name


def test_a_wrong_transfer_rule_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Halving the slope of exp makes the bound unsound, and the property check sees it."""
    case = make_case("exp", 0, "f32", only_first=False, scale=5.0)
    check_case(case, np.random.default_rng(0))
    right = difference.SLOPES["exp"]
    monkeypatch.setitem(difference.SLOPES, "exp", lambda a, out: 0.5 * right(a, out))
    with pytest.raises(AssertionError, match="exp"):
        check_case(case, np.random.default_rng(0))


# --------------------------------------------------------------------------------------
# tiny transformers


def _lora_models() -> ModuleType:
    """The LoRA tests' tiny transformers (their folder is not on the path of this one)."""
    if "lora_models" in sys.modules:
        return sys.modules["lora_models"]
    path = Path(__file__).resolve().parents[2] / "lora" / "lora_models.py"
    spec = importlib.util.spec_from_file_location("lora_models", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["lora_models"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:  # peft or transformers missing: the tests that need them skip
        del sys.modules["lora_models"]
        raise
    return module


def _token_ids(rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.integers(0, 64, (2, 5)).astype(np.int64)]


def _pixels(rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.uniform(-1.0, 1.0, (2, 3, 8, 8)).astype(np.float32)]


@dataclass
class Model:
    """An imported tiny transformer, its input box and a draw of inputs inside it."""

    module: Module
    ranges: dict[str, tuple[float, float]]
    draw: Callable[[np.random.Generator], list[np.ndarray]]


@pytest.fixture(scope="module")
def models() -> dict[str, Model]:
    torch = pytest.importorskip("torch")
    lm = _lora_models()
    import cuvil

    out = {}
    for name, arch in lm.ARCHS.items():
        torch.manual_seed(0)
        model = arch.build().eval()
        model.config.use_cache = False
        pixels = name == "vit"
        example = torch.zeros(2, 3, 8, 8) if pixels else torch.zeros(2, 5, dtype=torch.int64)
        module = cuvil.import_model(model, example_inputs=(example,))
        box = (-1.0, 1.0) if pixels else (0, 63)
        out[name] = Model(module, {module.main.params[0].name: box}, _pixels if pixels else _token_ids)
    return out


def linear_sites(fn: Function) -> list[Value]:
    """The matmuls of an input with a weight (their second operand depends on no input)."""
    live: set[Value] = set()
    for v in fn.values():
        if v.is_param or any(o in live for o in v.operands):
            live.add(v)
    return [v for v in fn.values() if v.op == "matmul" and v.operands[0] in live and v.operands[1] not in live]


def lora_sources(sites: list[Value], rng: np.random.Generator) -> tuple[dict[Value, Callable[..., np.ndarray]],
                                                                         dict[Value, np.ndarray]]:
    """A LoRA-like bound at each site, ``per_unit * max |x|`` per output feature, and the smallest bound the
    calls gave (the hulls of ``x``, and so the bounds, differ a little between the rule and the fast path)."""
    given: dict[Value, np.ndarray] = {}

    def make(v: Value) -> Callable[..., np.ndarray]:
        per_unit = 1e-3 * rng.uniform(0.5, 1.0, int(v.shape[-1]))

        def bound(x: Interval, w: Interval) -> np.ndarray:
            s = per_unit * float(np.max(x.magnitude()))
            given[v] = np.minimum(given[v], s) if v in given else s
            return s

        return bound

    return {v: make(v) for v in sites}, given


def run_perturbed(fn: Function, constants: Mapping[str, np.ndarray], inputs: list[np.ndarray],
                  moves: Mapping[Value, np.ndarray], rng: np.random.Generator, corner: bool) -> list[np.ndarray]:
    """``fn`` on ``inputs`` with each value in ``moves`` nudged by up to its bound after its op."""
    memo: dict[Value, np.ndarray] = dict(zip(fn.params, inputs, strict=True))
    for v in fn.values():
        if v in memo:
            continue
        if v.is_const:
            memo[v] = np.asarray(constants[v.const_hash])
            continue
        attrs = {k: bind_attr(a, {}) for k, a in v.attrs}
        out_type = TensorType(v.dtype, tuple(int(d) for d in v.shape))
        out = evaluate_op(get_op(v.op), [memo[o] for o in v.operands], attrs, out_type)
        memo[v] = _nudge(out, np.broadcast_to(moves[v], out.shape), rng, corner) if v in moves else out
    return [memo[r] for r in fn.results]


SITES: dict[str, Callable[[list[Value]], list[Value]]] = {
    "first two projections": lambda sites: sites[:2],
    "every projection": lambda sites: sites,
}


@pytest.mark.parametrize("sites", list(SITES))
@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "vit"])
def test_tiny_transformers_stay_within_their_difference_bounds(models: dict[str, Model], name: str,
                                                              sites: str) -> None:
    """Finite bounds at every output, held by 200 random inputs with perturbations drawn inside the sources'
    bounds (every other one at their extremes), for the rule and the fast path of the matmuls alike."""
    model = models[name]
    fn, constants = model.module.main, model.module.constants
    rng = np.random.default_rng(7)
    sources, given = lora_sources(SITES[sites](linear_sites(fn)), rng)
    bounds = [difference_bounds(fn, constants, model.ranges, sources, fast_path_min=m) for m in (1 << 40, 0)]
    for res in bounds:
        for k in range(len(fn.results)):
            assert np.all(np.isfinite(res.output(k))) and np.any(res.output(k) > 0), f"{name}: output {k}"
    worst = 0.0
    for t in range(200):
        inputs = model.draw(rng)
        p = run_perturbed(fn, constants, inputs, {}, rng, False)
        q = run_perturbed(fn, constants, inputs, given, rng, corner=t % 2 == 0)
        for k, r in enumerate(fn.results):
            gap = _gaps(p[k], q[k])
            for res in bounds:
                assert np.all(gap <= res.output(k)), f"{name}: output {k} left its bound on input {t}"
                assert not (_outside(p[k], res.hulls[r]).any() or _outside(q[k], res.hulls[r]).any())
            worst = max(worst, float(np.max(gap / bounds[0].output(k))))
    print(f"{name}, {sites}: largest |P' - P| / bound {worst:.3g}")


def test_zero_sources_on_models_leave_every_difference_exactly_zero(models: dict[str, Model]) -> None:
    for name, model in models.items():
        fn = model.module.main
        sources = {v: (lambda x, w: np.zeros(())) for v in linear_sites(fn)}
        res = difference_bounds(fn, model.module.constants, model.ranges, sources)
        assert all(not np.any(d) for d in res.values.values()), name
