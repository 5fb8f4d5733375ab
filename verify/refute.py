"""Refutation: concrete evidence that a rewrite changed a result, replayed before it is shown.

Three searches feed candidates, and every candidate is replayed on the reference interpreter
at the model's dtypes before it becomes a counterexample:

* float evaluation of the whole function on random and extreme inputs (zeros, signed zeros,
  tiny, huge, negative, values near 1 where an epsilon matters, and for ``exact`` contracts
  infinities and NaN), at the real dtypes and in float64 (a rounding-free reference);
* the same with the cut tensors themselves free (constants drawn within their data's range,
  which is what a proof may assume of them);
* a z3 model, decoded to concrete tensors.

Randomized identity testing over Z_p (``verify.modular``) runs alongside as a cross-check.

What counts as a difference follows the contract: ``exact`` compares bits (all NaNs equal,
signed zeros distinct); ``real`` flags a result that is NaN/infinite on one side only, or a
gap that float64 confirms and that exceeds the rounding noise of both sides.
"""

from __future__ import annotations

import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from cuvil.errors import CuvilError
from cuvil.interp import evaluate_values, run_function
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Function
from cuvil.ir.opdef import get_op
from cuvil.ir.symbolic import evaluate_dim
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value
from cuvil.passes.base import Contract
from verify.axioms import same_bits
from verify.cone import ConeFunctions, Leaf, float64_values, to_float64
from verify.modular import ModularEvaluator, Trace, random_residues, to_residues, work
from verify.prove import Attempt
from verify.verdict import Counterexample, TensorInput

MODES_EXACT = ("random", "signed-zeros", "negative-zeros", "specials", "zeros", "tiny", "huge", "negative", "near-one",
               "random-wide")
FREE_KINDS = ("param", "constant", "folded")
"""Cut leaves that may take independent values: a shared computed value is a function of the others."""
MODES_REAL = ("random", "tiny", "huge", "negative", "near-one", "zeros", "random-wide", "specials")
"""A real proof covers finite values; NaN and infinities are searched ("specials"), and a rewrite
they distinguish is refuted."""

RIT_WORK_LIMIT = 200_000_000
"""Element operations (``verify.modular.work``) beyond which the Z_p evaluation is skipped."""
RIT_CHECK_LIMIT = 20_000_000
"""The same limit when the obligation is already proved and the Z_p evaluation is only a
cross-check of the proof (a full-size ResNet or BERT-style encoder costs seconds per side)."""

MODEL_DIMS_ELEMENTS = 1 << 22
"""Largest tensor the search at a z3 model's dims generates."""
SEARCH_ELEMENTS = 1 << 27
"""Elements of all the values of one whole-function evaluation (or of one cut) beyond which the
concrete search is skipped and says so: the proof does not depend on it, memory would."""


def elements(types: Sequence[TensorType], dims: Mapping[str, int]) -> int:
    """How many elements tensors of ``types`` hold at ``dims`` (exact, in Python integers)."""
    total = 0
    for t in types:
        n = 1
        for d in t.shape:
            n *= evaluate_dim(d, dims)
        total += n
    return total


def _computed_types(fn: Function) -> list[TensorType]:
    return [v.type for v in fn.values() if not v.is_const]

_TINY = {DType.f16: 1e-6, DType.bf16: 1e-30, DType.f32: 1e-30, DType.f64: 1e-200}
_HUGE = {DType.f16: 300.0, DType.bf16: 1e15, DType.f32: 1e15, DType.f64: 1e150}


def concrete_dims(fn: Function) -> dict[str, int]:
    """Distinct sizes >= 2 for the function's symbols, within their constraints."""
    out: dict[str, int] = {}
    for k, s in enumerate(fn.symbols()):
        c = fn.constraint(s)
        v = max(c.lo, 2 + k)
        if c.multiple_of > 1:
            v = -(-v // c.multiple_of) * c.multiple_of
        if c.hi is not None and v > c.hi:
            v = c.hi - (c.hi % c.multiple_of)
        out[s] = max(v, c.lo)
    return out


def generate(t: TensorType, dims: Mapping[str, int], mode: str, rng: np.random.Generator,
             value_range: tuple[float, float] | None = None) -> np.ndarray:
    """An input tensor of type ``t`` for one search mode."""
    shape = tuple(evaluate_dim(d, dims) for d in t.shape)
    dt = t.dtype
    if dt is DType.bool:
        return rng.integers(0, 2, shape).astype(bool)
    if dt.is_int:
        lo, hi = (0, 16) if value_range is None else (int(value_range[0]), int(value_range[1]))
        if mode == "zeros":
            return np.zeros(shape, dtype=dt.np)
        return rng.integers(lo, max(hi, lo) + 1, shape).astype(dt.np)
    if value_range is not None:
        lo, hi = value_range
        if mode == "range-ends":
            x = np.where(rng.integers(0, 2, shape).astype(bool), lo, hi)
        else:
            x = rng.uniform(lo, hi, shape) if hi > lo else np.full(shape, lo)
        return np.asarray(x).astype(dt.np)
    sign = np.where(rng.integers(0, 2, shape).astype(bool), 1.0, -1.0)
    normal = rng.standard_normal(shape)
    if mode == "zeros":
        x = np.zeros(shape)
    elif mode == "signed-zeros":
        x = np.where(rng.integers(0, 2, shape).astype(bool), 0.0, -0.0)
    elif mode == "negative-zeros":
        x = np.where(rng.integers(0, 3, shape) == 0, normal, -0.0)
    elif mode == "tiny":
        x = sign * _TINY[dt] * (1 + np.abs(normal))
    elif mode == "huge":
        x = sign * _HUGE[dt] * (1 + np.abs(normal))
    elif mode == "negative":
        x = -np.abs(normal) * 3
    elif mode == "near-one":
        eps = float(np.finfo(np.float32).eps if dt is DType.bf16 else np.finfo(dt.np).eps)
        x = 1.0 + eps * rng.integers(-4, 5, shape)
    elif mode == "specials":
        pool = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 0.5, -2.0])
        x = pool[rng.integers(0, len(pool), shape)]
    elif mode == "random-wide":
        x = normal * 10.0 ** rng.integers(-3, 4, shape)
    else:
        x = normal
    with np.errstate(all="ignore"):
        return np.asarray(x).astype(dt.np)


def differences(b: np.ndarray, a: np.ndarray, b64: np.ndarray | None, a64: np.ndarray | None,
                contract: Contract) -> np.ndarray:
    """Elements where ``after`` differs from ``before`` beyond what ``contract`` allows."""
    if b.shape != a.shape:
        return np.ones(np.broadcast_shapes(b.shape, a.shape) if b.ndim == a.ndim else b.shape, dtype=bool)
    if b.dtype.kind != "f" and b.dtype.name != "bfloat16":
        return b != a
    if contract is Contract.EXACT or b.dtype != a.dtype:
        return ~same_bits(b, a)
    with np.errstate(all="ignore"):
        B, A = b.astype(np.float64), a.astype(np.float64)
        nan_b, nan_a = np.isnan(B), np.isnan(A)
        inf_b, inf_a = np.isinf(B), np.isinf(A)
        mismatch = (nan_b != nan_a) | (inf_b != inf_a) | (inf_b & inf_a & (np.sign(B) != np.sign(A)))
        finite = np.isfinite(B) & np.isfinite(A)
        gap = np.abs(B - A)
        eps = float(np.finfo(np.float32).eps) * 2 if b.dtype.name == "bfloat16" else float(np.finfo(b.dtype).eps)
        if b64 is None or a64 is None:
            scale = float(np.max(np.abs(np.where(finite, B, 0.0)), initial=0.0))
            big = gap > 1e-3 * scale + 1e-30
        else:
            B64, A64 = b64.astype(np.float64), a64.astype(np.float64)
            noise = np.abs(B - B64) + np.abs(A - A64)
            noise = np.where(np.isfinite(noise), noise, np.inf)
            tol = 4 * noise + 8 * eps * np.maximum(np.abs(B), np.abs(A)) + 1e-300
            real_gap = np.abs(B64 - A64) > 1e-9 * np.maximum(np.abs(B64), np.abs(A64)) + 1e-300
            big = (gap > tol) & real_gap & np.isfinite(B64) & np.isfinite(A64)
        return mismatch | (finite & big)


def _first(mask: np.ndarray) -> tuple[int, ...] | None:
    if not np.any(mask):
        return None
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(mask)), mask.shape))


_EVAL_ERRORS = (CuvilError, ValueError, IndexError, TypeError, FloatingPointError, KeyError)

RECENT_RUNS = 6
"""Whole-function evaluations kept across applications: in a pipeline one pass's ``after`` is the
next pass's ``before``. Values are interned, so a function's params and results identify it;
a hit only saves time (the interpreter is deterministic), so no verdict depends on what ran
earlier in the process."""
_recent: OrderedDict[tuple, dict[Value, np.ndarray] | None] = OrderedDict()


class Evaluations:
    """Whole-function evaluations of one pass application on the search inputs, made once and
    shared by the cut-point sweep and every obligation's float search (at full model size an
    interpreter run dominates the cost of a check). A mode's inputs depend only on the seed and
    the mode, so an application's checks do not depend on what ran before them."""

    def __init__(self, before: Function, after: Function, constants: Mapping[str, np.ndarray],
                 seed: int = 0, dims: Mapping[str, int] | None = None) -> None:
        self.fns = {"before": before, "after": after}
        self.constants = constants
        self.seed = seed
        self.dims = dict(dims) if dims is not None else concrete_dims(before)
        self.elements = elements(_computed_types(before) + _computed_types(after), self.dims)
        self._inputs: dict[str, list[np.ndarray]] = {}
        self._values: dict[tuple[str, str, bool], dict[Value, np.ndarray] | None] = {}

    def inputs(self, mode: str) -> list[np.ndarray]:
        found = self._inputs.get(mode)
        if found is None:
            rng = np.random.default_rng([self.seed, zlib.crc32(mode.encode())])
            found = [generate(p.type, self.dims, mode, rng) for p in self.fns["before"].params]
            self._inputs[mode] = found
        return found

    def values(self, side: str, mode: str, wide: bool = False) -> dict[Value, np.ndarray] | None:
        """Every value of one side on ``mode``'s inputs (None when the interpreter rejects them);
        ``wide``: computed in float64 throughout, keyed by the original values."""
        key = (side, mode, wide)
        if self.elements > SEARCH_ELEMENTS:
            return None
        if key not in self._values:
            fn = self.fns[side]
            shared = (fn.params, fn.results, mode, wide, self.seed, tuple(sorted(self.dims.items())))
            if shared in _recent:
                _recent.move_to_end(shared)
                self._values[key] = _recent[shared]
            else:
                self._values[key] = _recent[shared] = self._evaluate(fn, self.inputs(mode), wide)
                while len(_recent) > RECENT_RUNS:
                    _recent.popitem(last=False)
        return self._values[key]

    def _evaluate(self, fn: Function, inputs: list[np.ndarray], wide: bool) -> dict[Value, np.ndarray] | None:
        try:
            if not wide:
                return evaluate_values(fn, self.constants, inputs)
            conv = float64_values(fn, self.constants)
            if conv is None:
                return None
            mapping, consts = conv
            fn64 = Function(fn.name, tuple(mapping[p] for p in fn.params), tuple(mapping[r] for r in fn.results),
                            fn.result_names, fn.constraints)
            xs = [np.asarray(x).astype(mapping[p].type.dtype.np) for x, p in zip(inputs, fn.params, strict=True)]
            memo = evaluate_values(fn64, consts, xs)
            return {v: memo[mapping[v]] for v in fn.values() if mapping.get(v) in memo}
        except _EVAL_ERRORS:
            return None


@dataclass
class ObligationCase:
    """What the refuter needs about one obligation."""

    before_fn: Function
    after_fn: Function
    position: int
    constants: Mapping[str, np.ndarray]
    cones: ConeFunctions
    contract: Contract
    output: str
    leaf_of: Callable[[Value], Leaf | None]
    """The obligation's leaf lookup: every value it reads as a folded constant's bytes (several expressions
    can share one folded leaf, of which ``cones.inputs`` names one)."""


@dataclass
class Search:
    counterexample: Counterexample | None = None
    rit_differs: bool | None = None
    rit_index: tuple[int, ...] | None = None
    rit_trace: Trace | None = None
    tried: list[str] = field(default_factory=list)
    seconds: float = 0.0


class Refuter:
    """Searches one obligation; float64 versions of the functions are built once."""

    def __init__(self, case: ObligationCase, seed: int = 0, runs: Evaluations | None = None) -> None:
        self.case = case
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.dims = concrete_dims(case.before_fn)
        self.runs = runs if runs is not None else Evaluations(case.before_fn, case.after_fn, case.constants, seed)
        self._f64: dict[str, tuple[Function, dict[str, np.ndarray]] | None] = {}

    def _wide(self, name: str, fn: Function) -> tuple[Function, dict[str, np.ndarray]] | None:
        if name not in self._f64:
            self._f64[name] = to_float64(fn, self.case.constants)
        return self._f64[name]

    def _run(self, fn: Function, inputs: Sequence[np.ndarray], name: str, wide: bool, position: int = 0
             ) -> np.ndarray | None:
        try:
            if not wide:
                return run_function(fn, self.case.constants, list(inputs))[position]
            conv = self._wide(name, fn)
            if conv is None:
                return None
            fn64, consts64 = conv
            xs = [np.asarray(x).astype(p.type.dtype.np) for x, p in zip(inputs, fn64.params, strict=True)]
            return run_function(fn64, consts64, xs)[0]
        except _EVAL_ERRORS:
            return None

    # the searches ---------------------------------------------------------------------------
    def search(self, attempt: Attempt | None, *, budget: float = 5.0, full: bool = True,
               float_search: bool = True, more_models: Sequence[Attempt | None] = ()) -> Search:
        """``float_search=False``: only what the z3 models give (their values, or their dims);
        ``more_models``: other attempts whose models' dims are searched too."""
        start = time.perf_counter()
        out = Search()
        modes = MODES_EXACT if self.case.contract is Contract.EXACT else MODES_REAL
        if not full and self.case.contract is Contract.EXACT:
            modes = modes[:2]  # a cross-check of an exact proof; real proofs keep every extreme (overflow)
        if not float_search:
            modes = ()
        if modes and self.runs.elements > SEARCH_ELEMENTS:
            out.tried.append(f"float evaluation (skipped: {self.runs.elements} elements, more than "
                             f"{SEARCH_ELEMENTS}, at dims {self.dims})")
            modes = ()
        cut_fits = elements([leaf.type for leaf in self.case.cones.inputs], self.dims) <= SEARCH_ELEMENTS
        self._rit(out, RIT_WORK_LIMIT if full else RIT_CHECK_LIMIT)
        found: list[Counterexample] = []  # real contracts: rounding differences, kept while the search goes on

        def done() -> bool:
            return out.counterexample is not None or time.perf_counter() - start > budget

        def take(ce: Counterexample | None) -> None:
            if ce is not None and self.case.contract is Contract.REAL and _finite_both(ce):
                found.append(ce)  # what a real proof admits: look on for NaN/infinity on one side only
                return
            out.counterexample = ce

        for mode in modes:
            if done():
                break
            out.tried.append(f"float {mode}")
            take(self._model_inputs(mode))
        independent = all(leaf.kind in FREE_KINDS for leaf in self.case.cones.inputs)
        if out.counterexample is None and independent and attempt is not None and attempt.model_inputs is not None:
            out.tried.append("z3 model")
            take(self._from_model(attempt))
        tried_dims: list[dict[str, int]] = []
        for source in (attempt, *more_models):
            if out.counterexample is not None or source is None or not source.model_dims:
                continue
            if source.model_dims in tried_dims:
                continue
            tried_dims.append(source.model_dims)
            take(self._at_model_dims(source, out, independent))
        if full and independent and float_search and cut_fits:
            for mode in ("random", "range-ends", "tiny", "huge", "negative-zeros"):
                if done():
                    break
                out.tried.append(f"free cut {mode}")
                take(self._free_cut(mode))
        if out.counterexample is None and found:
            out.counterexample = found[0]
        out.seconds = time.perf_counter() - start
        return out

    def _model_inputs(self, mode: str) -> Counterexample | None:
        """Random/extreme inputs for the whole function, the model's constants as they are."""
        case = self.case
        memo = self.runs.values("before", mode)
        if memo is None:
            return None
        inputs = self.runs.inputs(mode)
        by_param = dict(zip(case.before_fn.params, inputs, strict=True))
        cut: dict[str, np.ndarray] = {}
        for leaf in case.cones.inputs:
            v = leaf.before
            if v is None or (v not in memo and v not in by_param):
                return None
            cut[leaf.key] = by_param[v] if v in by_param else memo[v]
        # the cones on values the functions computed are the functions' results (the interpreter is
        # deterministic, and both sides compute each cut value alike, folded constants included):
        # results equal bit for bit differ under no contract, and leave nothing to replay
        before = memo.get(case.before_fn.results[case.position])
        memo_a = self.runs.values("after", mode)
        after = None if memo_a is None else memo_a.get(case.after_fn.results[case.position])
        if before is not None and after is not None and _identical(before, after):
            return None
        ce = self._try_cut_values(cut, f"float evaluation ({mode} inputs)", free=False, before=before, after=after)
        if ce is None and before is not None and after is not None:
            ce = self._whole_function(inputs, f"float evaluation ({mode} inputs)")
        if ce is not None:
            ce.function_inputs = {p.name: x for p, x in zip(case.before_fn.params, inputs, strict=True)}
        return ce

    def _whole_function(self, inputs: Sequence[np.ndarray], found_by: str) -> Counterexample | None:
        """A difference of the whole functions, replayed on them (when the cones cannot be run
        alone: a dim only an attribute names, at an extent the cut leaves do not show)."""
        case = self.case
        rb = self._run(case.before_fn, inputs, "before", wide=False, position=case.position)
        ra = self._run(case.after_fn, inputs, "after", wide=False, position=case.position)
        if rb is None or ra is None or self.case.contract is not Contract.EXACT:
            return None
        at = _first(differences(rb, ra, None, None, case.contract))
        if at is None:
            return None
        params = [TensorInput(f"%{p.name}", p.type, "param", np.asarray(x))
                  for p, x in zip(case.before_fn.params, inputs, strict=True)]
        return Counterexample(case.output, at, str(rb.dtype), rb[at].item(), ra[at].item(), params, found_by,
                              note="replayed on the whole function")

    def _from_model(self, attempt: Attempt) -> Counterexample | None:
        """A z3 model's cut values, first with the module's own constants (then, when every other
        leaf is a parameter, the counterexample replays on the whole function), else as decoded."""
        assert attempt.model_inputs is not None
        leaves = self.case.cones.inputs
        own = {leaf.key: leaf.data for leaf in leaves
               if leaf.kind in ("constant", "local-constant", "folded") and leaf.data is not None}
        cut = {**attempt.model_inputs, **own}
        ce = self._try_cut_values(cut, "a z3 model", free=False, index=attempt.model_index)
        if ce is not None:
            params = {leaf.before: cut[leaf.key] for leaf in leaves if leaf.kind == "param"}
            fn = self.case.before_fn
            if all(p in params for p in fn.params) and all(leaf.kind != "shared" for leaf in leaves):
                ce.function_inputs = {p.name: np.asarray(params[p]) for p in fn.params}
            return ce
        if not own:
            return None
        return self._try_cut_values(attempt.model_inputs, "a z3 model", free=True, index=attempt.model_index)

    def _at_model_dims(self, attempt: Attempt, out: Search, independent: bool) -> Counterexample | None:
        """A z3 model names dims where the sides can differ (an empty extent, one specific size),
        even when its values cannot be decoded or do not replay: search there."""
        dims = self._model_dims(attempt)
        if dims is None:
            return None
        case = self.case
        runs = Evaluations(case.before_fn, case.after_fn, case.constants, self.seed, dims)
        saved_dims, saved_runs = self.dims, self.runs
        self.dims, self.runs = dims, runs
        try:
            for mode in ("random", "specials", "signed-zeros"):
                out.tried.append(f"float {mode} at the z3 model's dims")
                found = self._model_inputs(mode)
                if found is None and independent:
                    out.tried.append(f"free cut {mode} at the z3 model's dims")
                    found = self._free_cut(mode)
                if found is not None:
                    shown = ", ".join(f"{k}={v}" for k, v in sorted(dims.items()))
                    found.found_by += f" at the z3 model's dims ({shown})"
                    return found
        finally:
            self.dims, self.runs = saved_dims, saved_runs
        return None

    def _model_dims(self, attempt: Attempt) -> dict[str, int] | None:
        """The dims of a z3 model, when they differ from the search's and keep tensors small."""
        symbols = set(self.case.before_fn.symbols())
        dims = {**self.dims, **{k: v for k, v in attempt.model_dims.items() if k in symbols}}
        if dims == self.dims:
            return None
        try:
            sizes = [int(np.prod([evaluate_dim(d, dims) for d in leaf.type.shape], dtype=np.float64))
                     for leaf in self.case.cones.inputs]
        except (KeyError, ValueError):
            return None
        return dims if all(0 <= n <= MODEL_DIMS_ELEMENTS for n in sizes) else None

    def _free_cut(self, mode: str) -> Counterexample | None:
        cut: dict[str, np.ndarray] = {}
        for leaf in self.case.cones.inputs:
            rng = leaf.value_range if leaf.kind in ("constant", "folded") else None
            m = mode if rng is not None or mode != "range-ends" else "random"
            cut[leaf.key] = generate(leaf.type, self.dims, m, self.rng, rng)
        return self._try_cut_values(cut, f"free cut values ({mode})", free=True)

    def _try_cut_values(self, cut: Mapping[str, np.ndarray], found_by: str, *, free: bool,
                        index: tuple[int, ...] | None = None, before: np.ndarray | None = None,
                        after: np.ndarray | None = None) -> Counterexample | None:
        """Evaluate both cones on ``cut``; a difference is replayed and returned. ``before`` /
        ``after``: a cone's result on ``cut`` when already known (a whole function computed it)."""
        cones = self.case.cones
        xs: list[np.ndarray] = []
        for leaf in cones.inputs:
            arr = cut.get(leaf.key)
            if arr is None:
                arr = generate(leaf.type, self.dims, "random", self.rng, leaf.value_range)
            xs.append(np.asarray(arr).astype(leaf.type.dtype.np))
        b = before if before is not None else self._run(cones.before, xs, "cone-before", wide=False)
        a = after if after is not None else self._run(cones.after, xs, "cone-after", wide=False)
        if b is None or a is None:
            return None
        b64 = a64 = None
        if self.case.contract is not Contract.EXACT:  # exact contracts compare bits: float64 plays no part
            if not _candidates(b, a):  # a real difference needs a gap above 8 ulps, or a non-finite side
                return None
            b64 = self._run(cones.before, xs, "cone-before", wide=True)
            a64 = self._run(cones.after, xs, "cone-after", wide=True)
        mask = differences(b, a, b64, a64, self.case.contract)
        at = index if index is not None and mask.shape and _in(mask, index) and mask[index] else _first(mask)
        if at is None:
            return None
        # the replay: the same cones, run again from the recorded tensors
        rb = self._run(cones.before, xs, "cone-before", wide=False)
        ra = self._run(cones.after, xs, "cone-after", wide=False)
        if rb is None or ra is None or not differences(rb, ra, b64, a64, self.case.contract)[at]:
            return None
        inputs = [TensorInput(leaf.label, leaf.type, leaf.kind, x) for leaf, x in zip(cones.inputs, xs, strict=True)]
        note = ""
        if self.case.contract is Contract.REAL and b64 is not None and a64 is not None:
            note = f"float64: before {float(b64[at]):.9g}, after {float(a64[at]):.9g}"
        return Counterexample(self.case.output, at, str(cones.before.results[0].dtype), rb[at].item(),
                              ra[at].item(), inputs, found_by, model_constants=not free, note=note)

    def _rit(self, out: Search, limit: int = RIT_WORK_LIMIT) -> None:
        """Both functions over Z_p at one random point: parameters and the constants both sides
        share are random, except those the proof reads as their values (splats: a rewrite of ``x * 1``
        is proved by the value); a folded constant takes the value its expression computes. Shared
        computed values are not free symbols: they are evaluated from these."""
        case = self.case
        if work(case.before_fn, self.dims) + work(case.after_fn, self.dims) > limit:
            out.tried.append("randomized identity test (skipped: the functions are too large)")
            return
        if _region_constants(case.before_fn) != _region_constants(case.after_fn):
            # a pass folded constants inside a loop body or branch: the regions were proved equal as
            # functions, but the Z_p reading of one side's folded constant is not its expression's
            out.tried.append("randomized identity test (skipped: loops or branches read different constants)")
            return
        ev = ModularEvaluator(self.seed)
        xs = [random_residues(tuple(evaluate_dim(d, self.dims) for d in p.type.shape), self.rng)
              if p.type.dtype.is_float else generate(p.type, self.dims, "random", self.rng)
              for p in case.before_fn.params]
        free: dict[str, np.ndarray] = {}
        for leaf in case.cones.inputs:
            v = leaf.before
            if leaf.kind == "constant" and not leaf.concrete and v is not None and v.dtype.is_float:
                free[v.const_hash] = random_residues(tuple(int(d) for d in v.type.shape), self.rng)
        # a folded leaf is its bytes on both sides: every expression read as one, on its side, takes the
        # constant's image instead of its own Z_p value (which oracles such as round() would make differ from
        # the image of the float result)
        preset_b, preset_a = (_folded_presets(case, fn) for fn in (case.before_fn, case.after_fn))
        try:
            mb = ev.run(case.before_fn, case.constants, xs, self.dims, preset=preset_b, free_constants=free)
            ma = ev.run(case.after_fn, case.constants, xs, self.dims, preset=preset_a, free_constants=free)
            rb = mb[case.before_fn.results[case.position]]
            ra = ma[case.after_fn.results[case.position]]
        except (CuvilError, ValueError, IndexError, TypeError, KeyError, MemoryError):
            out.tried.append("randomized identity test (not applicable)")
            return
        out.tried.append("randomized identity test over Z_p")
        out.rit_trace = ev.trace
        if rb.shape != ra.shape:
            out.rit_differs = True
            return
        mask = rb != ra
        out.rit_differs = bool(np.any(mask))
        out.rit_index = _first(mask)


def _folded_presets(case: ObligationCase, fn: Function) -> dict[Value, np.ndarray]:
    """Each value of ``fn`` (not a constant itself) that the obligation reads as one of its cones' folded
    leaves, with that leaf's tensor in the Z_p reading: a float's residue image, an integer or bool as it is."""
    keys = {leaf.key for leaf in case.cones.inputs if leaf.kind == "folded" and leaf.data is not None}
    out: dict[Value, np.ndarray] = {}
    for v in fn.values():
        leaf = None if v.is_const else case.leaf_of(v)
        if leaf is not None and leaf.key in keys and leaf.data is not None:
            out[v] = to_residues(leaf.data) if leaf.type.dtype.is_float else np.asarray(leaf.data)
    return out


def _region_constants(fn: Function) -> frozenset[str]:
    """The constants the loops and conds of ``fn`` read (by content hash)."""
    return frozenset(o.const_hash for v in fn.ops() if get_op(v.op).structured for o in v.operands if o.is_const)


def _finite_both(ce: Counterexample) -> bool:
    """Both sides finite at the counterexample's index (a rounding difference, not NaN/infinity)."""
    def finite(x: object) -> bool:
        return isinstance(x, (bool, int, np.integer, np.bool_)) or np.isfinite(float(x))  # type: ignore[arg-type]

    return finite(ce.before) and finite(ce.after)


def _candidates(b: np.ndarray, a: np.ndarray) -> bool:
    """Whether ``differences`` can flag anything under a ``real`` contract, whatever float64 says
    (its tolerance is at least 8 ulps of the larger side)."""
    if b.shape != a.shape or b.dtype != a.dtype or (b.dtype.kind != "f" and b.dtype.name != "bfloat16"):
        return True
    with np.errstate(all="ignore"):
        B, A = b.astype(np.float64), a.astype(np.float64)
        if np.any(np.isnan(B) != np.isnan(A)) or np.any(np.isinf(B) != np.isinf(A)):
            return True
        if np.any(np.isinf(B) & np.isinf(A) & (np.sign(B) != np.sign(A))):
            return True
        eps = float(np.finfo(np.float32).eps) * 2 if b.dtype.name == "bfloat16" else float(np.finfo(b.dtype).eps)
        finite = np.isfinite(B) & np.isfinite(A)
        return bool(np.any(finite & (np.abs(B - A) > 8 * eps * np.maximum(np.abs(B), np.abs(A)) + 1e-300)))


def _identical(b: np.ndarray, a: np.ndarray) -> bool:
    """Same shape, dtype and bits (NaNs identified): no contract sees a difference."""
    if b.shape != a.shape or b.dtype != a.dtype:
        return False
    if b.dtype.kind != "f" and b.dtype.name != "bfloat16":
        return bool(np.array_equal(b, a))
    return bool(np.all(same_bits(b, a)))


def _in(mask: np.ndarray, index: tuple[int, ...]) -> bool:
    return len(index) == mask.ndim and all(0 <= i < s for i, s in zip(index, mask.shape, strict=True))

