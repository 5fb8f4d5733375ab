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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from cuvil.errors import CuvilError
from cuvil.interp import evaluate_values, run_function
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Function
from cuvil.ir.symbolic import evaluate_dim
from cuvil.ir.types import TensorType
from cuvil.passes.base import Contract
from verify.axioms import same_bits
from verify.cone import ConeFunctions, to_float64
from verify.modular import ModularEvaluator, Trace, random_residues, work
from verify.prove import Attempt
from verify.verdict import Counterexample, TensorInput

MODES_EXACT = ("random", "signed-zeros", "negative-zeros", "specials", "zeros", "tiny", "huge", "negative", "near-one",
               "random-wide")
FREE_KINDS = ("param", "constant", "folded")
"""Cut leaves that may take independent values: a shared computed value is a function of the others."""
MODES_REAL = ("random", "tiny", "huge", "negative", "near-one", "zeros", "random-wide")

RIT_WORK_LIMIT = 200_000_000
"""Element operations beyond which the Z_p evaluation is skipped (full-size CNNs)."""

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

    def __init__(self, case: ObligationCase, seed: int = 0) -> None:
        self.case = case
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.dims = concrete_dims(case.before_fn)
        self._f64: dict[str, tuple[Function, dict[str, np.ndarray]] | None] = {}

    def _wide(self, name: str, fn: Function) -> tuple[Function, dict[str, np.ndarray]] | None:
        if name not in self._f64:
            self._f64[name] = to_float64(fn, self.case.constants)
        return self._f64[name]

    def _run(self, fn: Function, inputs: Sequence[np.ndarray], name: str, wide: bool
             ) -> np.ndarray | None:
        try:
            if not wide:
                return run_function(fn, self.case.constants, list(inputs))[0]
            conv = self._wide(name, fn)
            if conv is None:
                return None
            fn64, consts64 = conv
            xs = [np.asarray(x).astype(p.type.dtype.np) for x, p in zip(inputs, fn64.params, strict=True)]
            return run_function(fn64, consts64, xs)[0]
        except (CuvilError, ValueError, IndexError, TypeError, FloatingPointError):
            return None

    # the searches ---------------------------------------------------------------------------
    def search(self, attempt: Attempt | None, *, budget: float = 5.0, full: bool = True) -> Search:
        start = time.perf_counter()
        out = Search()
        modes = MODES_EXACT if self.case.contract is Contract.EXACT else MODES_REAL
        if not full and self.case.contract is Contract.EXACT:
            modes = modes[:2]  # a cross-check of an exact proof; real proofs keep every extreme (overflow)
        self._rit(out)
        for mode in modes:
            if out.counterexample is not None or time.perf_counter() - start > budget:
                break
            out.tried.append(f"float {mode}")
            out.counterexample = self._model_inputs(mode)
        independent = all(leaf.kind in FREE_KINDS for leaf in self.case.cones.inputs)
        if out.counterexample is None and independent and attempt is not None and attempt.model_inputs is not None:
            out.tried.append("z3 model")
            out.counterexample = self._try_cut_values(attempt.model_inputs, "a z3 model", free=True,
                                                      index=attempt.model_index)
        if full and independent:
            for mode in ("random", "range-ends", "tiny", "huge", "negative-zeros"):
                if out.counterexample is not None or time.perf_counter() - start > budget:
                    break
                out.tried.append(f"free cut {mode}")
                out.counterexample = self._free_cut(mode)
        out.seconds = time.perf_counter() - start
        return out

    def _model_inputs(self, mode: str) -> Counterexample | None:
        """Random/extreme inputs for the whole function, the model's constants as they are."""
        case = self.case
        inputs = [generate(p.type, self.dims, mode, self.rng) for p in case.before_fn.params]
        try:
            memo = evaluate_values(case.before_fn, case.constants, inputs)
        except (CuvilError, ValueError, IndexError, TypeError):
            return None
        by_param = dict(zip(case.before_fn.params, inputs, strict=True))
        cut: dict[str, np.ndarray] = {}
        for leaf in case.cones.inputs:
            v = leaf.before
            if v is None or (v not in memo and v not in by_param):
                return None
            cut[leaf.key] = by_param[v] if v in by_param else memo[v]
        ce = self._try_cut_values(cut, f"float evaluation ({mode} inputs)", free=False)
        if ce is not None:
            ce.function_inputs = {p.name: x for p, x in zip(case.before_fn.params, inputs, strict=True)}
        return ce

    def _free_cut(self, mode: str) -> Counterexample | None:
        cut: dict[str, np.ndarray] = {}
        for leaf in self.case.cones.inputs:
            rng = leaf.value_range if leaf.kind in ("constant", "folded") else None
            m = mode if rng is not None or mode != "range-ends" else "random"
            cut[leaf.key] = generate(leaf.type, self.dims, m, self.rng, rng)
        return self._try_cut_values(cut, f"free cut values ({mode})", free=True)

    def _try_cut_values(self, cut: Mapping[str, np.ndarray], found_by: str, *, free: bool,
                        index: tuple[int, ...] | None = None) -> Counterexample | None:
        """Evaluate both cones on ``cut``; a difference is replayed and returned."""
        cones = self.case.cones
        xs: list[np.ndarray] = []
        for leaf in cones.inputs:
            arr = cut.get(leaf.key)
            if arr is None:
                arr = generate(leaf.type, self.dims, "random", self.rng, leaf.value_range)
            xs.append(np.asarray(arr).astype(leaf.type.dtype.np))
        b = self._run(cones.before, xs, "cone-before", wide=False)
        a = self._run(cones.after, xs, "cone-after", wide=False)
        if b is None or a is None:
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

    def _rit(self, out: Search) -> None:
        """Both functions over Z_p at one random point: parameters and the constants both sides
        share are random; a folded constant takes the value its expression computes. Shared
        computed values are not free symbols: they are evaluated from these."""
        case = self.case
        if work(case.before_fn, self.dims) + work(case.after_fn, self.dims) > RIT_WORK_LIMIT:
            out.tried.append("randomized identity test (skipped: the functions are too large)")
            return
        ev = ModularEvaluator(self.seed)
        xs = [random_residues(tuple(evaluate_dim(d, self.dims) for d in p.type.shape), self.rng)
              if p.type.dtype.is_float else generate(p.type, self.dims, "random", self.rng)
              for p in case.before_fn.params]
        free: dict[str, np.ndarray] = {}
        for leaf in case.cones.inputs:
            v = leaf.before
            if leaf.kind == "constant" and v is not None and v.dtype.is_float:
                free[v.const_hash] = random_residues(tuple(int(d) for d in v.type.shape), self.rng)
        try:
            mb = ev.run(case.before_fn, case.constants, xs, self.dims, free_constants=free)
            preset = {}
            for leaf in case.cones.inputs:
                if leaf.kind == "folded" and leaf.before is not None and leaf.after is not None:
                    preset[leaf.after] = mb[leaf.before]
            ma = ev.run(case.after_fn, case.constants, xs, self.dims, preset=preset, free_constants=free)
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


def _in(mask: np.ndarray, index: tuple[int, ...]) -> bool:
    return len(index) == mask.ndim and all(0 <= i < s for i, s in zip(index, mask.shape, strict=True))

