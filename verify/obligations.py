"""Obligations of one pass application, and their verdicts.

The two modules are diffed by structural hash per function and result. A result whose hash
did not change needs no proof; every other result is one obligation: its cone before and
after the pass, cut at the values both share. The contract chooses the encoder (``exact``:
abstract floating point; ``real``: real arithmetic; ``bounded``: left to the overflow
prober). Each obligation gets a proof attempt and, always, a refutation search; the two are
combined into one verdict, and a proof contradicted by a replayed counterexample raises.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import z3

from cuvil.errors import BudgetError, UnsupportedOpError
from cuvil.ir.hashing import constant_conflicts, module_hash, structural_hash
from cuvil.ir.module import Function, Module, content_hash
from cuvil.ir.opdef import get_op
from cuvil.ir.ops.control import open_regions
from cuvil.ir.unroll import module_has_loops, unroll_module
from cuvil.ir.values import Value
from cuvil.passes.base import Contract, Pass
from cuvil.passes.loop_bodies import body_function
from verify.cone import INPUT_KINDS, ConeFunctions, LeafTable, cone_function, param_dependent
from verify.cone_encoder import Leaf, non_unit_extents, unit_view
from verify.errors import VerifierInconsistency
from verify.prove import Attempt, prove
from verify.refute import Evaluations, ObligationCase, Refuter, Search
from verify.verdict import Counterexample, Proved, Refuted, Unknown, Verdict

DEFAULT_TIMEOUT = 10.0

ENCODER_FOR = {Contract.EXACT: "abstract-fp", Contract.REAL: "real"}

BOUNDED_REASON = "bounded contracts are checked by the overflow prober"

# real axioms a Z_p evaluation does not model (its transcendental functions are random oracles)
_NON_FIELD_AXIOMS = ("sqrt-square", "sqrt-nonnegative", "sqrt-positive", "exp-positive")
# laws of either encoder a Z_p evaluation does not model (a float's bits there are a random oracle)
_NOT_IN_Z_P = ("bitcast-round-trip", "bitcast-literal")


@dataclass
class ObligationRecord:
    """One obligation: what was to be shown, how, and the verdict."""

    pass_name: str
    contract: str
    function: str
    output: str
    cone: tuple[int, int]
    encoder: str
    verdict: Verdict
    seconds: float
    shapes: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    kind: str = "output"
    query: str = ""
    """The proof's SMT-LIB 2 query (proved obligations): a stock solver answers ``unsat``."""

    @property
    def status(self) -> str:
        return self.verdict.kind

    def to_json(self) -> dict[str, Any]:
        v = self.verdict
        out: dict[str, Any] = {
            "pass": self.pass_name, "contract": self.contract, "function": self.function, "output": self.output,
            "kind": self.kind, "cone_size": {"before": self.cone[0], "after": self.cone[1]}, "encoder": self.encoder,
            "verdict": v.kind, "seconds": round(self.seconds, 4), "shapes": list(self.shapes),
            "notes": list(self.notes),
        }
        if isinstance(v, Proved):
            out["axioms"] = list(v.axioms)
            out["tier"] = _TIERS.get(v.encoder, v.encoder)
            out["query"] = {"smt2": self.query, "answer": "unsat"}
        elif isinstance(v, Refuted):
            out["counterexample"] = v.counterexample.to_json()
        else:
            out["reason"] = v.reason
        return out


_TIERS = {"abstract-fp": "exact (opaque float operations; bit-exact)",
          "int": "exact (bit-vectors at the real widths)",
          "real": "real (ideal arithmetic; floats may differ by rounding)",
          "structural": "exact (structurally identical)"}


@dataclass
class Application:
    """The obligations of one pass applied to one module."""

    pass_name: str
    contract: str
    obligations: list[ObligationRecord] = field(default_factory=list)
    identical_outputs: int = 0
    seconds: float = 0.0
    vacuous: str = ""
    """Why the application has no obligation although it changed the module (metadata only,
    every result identical); such an application is reported, never counted as proved."""
    before_hash: str = ""
    after_hash: str = ""
    lemmas: list[str] = field(default_factory=list)
    """SMT-LIB queries of the cut-point lemmas the obligations rely on (each answered ``unsat``)."""
    lemma_axioms: set[str] = field(default_factory=set)
    """Axioms the proved lemmas used (the certificate lists them with the obligations' own)."""
    congruences: list[dict[str, Any]] = field(default_factory=list)
    """Pairs the obligations rely on that were cut without a query (see ``LeafTable.congruences``)."""

    def count(self, kind: str) -> int:
        return sum(1 for o in self.obligations if o.status == kind)

    @property
    def refuted(self) -> list[ObligationRecord]:
        return [o for o in self.obligations if o.status == "refuted"]

    @property
    def unknown(self) -> list[ObligationRecord]:
        return [o for o in self.obligations if o.status == "unknown"]

    @property
    def proved(self) -> bool:
        """Every obligation proved, and there is at least one (a vacuous application proves nothing)."""
        return bool(self.obligations) and all(o.status == "proved" for o in self.obligations)

    def to_json(self) -> dict[str, Any]:
        out = {"pass": self.pass_name, "contract": self.contract, "before_hash": self.before_hash,
               "after_hash": self.after_hash, "identical_outputs": self.identical_outputs,
               "seconds": round(self.seconds, 4), "obligations": [o.to_json() for o in self.obligations],
               "lemmas": [{"smt2": q, "answer": "unsat"} for q in self.lemmas],
               "congruences": list(self.congruences)}
        if self.vacuous:
            out["vacuous"] = self.vacuous
        return out


SEARCH_MODES = ("both", "prover", "refuter")
"""``both``: prove and search; ``prover``: no random or edge-value float search (counterexamples
come from z3 models only); ``refuter``: no proof attempt (what random testing alone finds). The
last two exist to measure what each half of the verifier catches."""


def check_application(pass_: Pass, before: Module, after: Module, *, timeout: float = DEFAULT_TIMEOUT,
                      seed: int = 0, search: str = "both") -> Application:
    """Every obligation of ``before -> after`` under ``pass_``'s contract."""
    start = time.perf_counter()
    app = Application(pass_.name, str(pass_.contract), before_hash=module_hash(before), after_hash=module_hash(after))
    for key in constant_conflicts(after.constants):
        app.obligations.append(_structural(pass_, "*", f"@{key}", "constant check", key,
                                           content_hash(after.constants[key]),
                                           "the pass stored other bytes under an existing constant key"))
    for fb in before.functions:
        fa = next((f for f in after.functions if f.name == fb.name), None)
        if fa is None:
            app.obligations.append(_record(pass_, fb.name, "*", Unknown(f"the pass removed function @{fb.name}")))
            continue
        if fb.param_types != fa.param_types or [p.name for p in fb.params] != [p.name for p in fa.params] \
                or len(fb.results) != len(fa.results):
            app.obligations.append(_structural(pass_, fb.name, "*", "signature check",
                                               "; ".join(str(t) for t in fb.param_types),
                                               "; ".join(str(t) for t in fa.param_types),
                                               "the pass changed the function's signature"))
            continue
        if fb.result_names != fa.result_names:
            app.obligations.append(_structural(pass_, fb.name, "*", "output names", ", ".join(fb.result_names),
                                               ", ".join(fa.result_names), "the pass renamed or reordered outputs"))
            continue
        if fb.constraints != fa.constraints:
            app.obligations.append(_structural(pass_, fb.name, "*", "dim constraints",
                                               "; ".join(map(str, fb.constraints)) or "(none)",
                                               "; ".join(map(str, fa.constraints)) or "(none)",
                                               "the pass changed the dims the function accepts"))
            continue
        diffs = [r for r in range(len(fb.results))
                 if structural_hash(fb.results[r]) != structural_hash(fa.results[r])]
        app.identical_outputs += len(fb.results) - len(diffs)
        if not diffs:
            continue
        if pass_.contract is Contract.BOUNDED:
            for r in diffs:
                app.obligations.append(_record(pass_, fb.name, fb.result_names[r], Unknown(BOUNDED_REASON)))
            continue
        table = LeafTable.build(fb, fa, before.constants, after.constants)
        constants = {**before.constants, **after.constants}
        cut_table = table.copy()
        runs = Evaluations(fb, fa, constants, seed)
        bodies = BodyProofs(pass_, fb, (before.constants, after.constants), timeout, seed, search)
        lemmas = _sweep(fb, fa, cut_table, runs, ENCODER_FOR[pass_.contract], timeout, bodies) \
            if search != "refuter" else []
        bodies.record(app, table)
        app.lemmas += [lm.smt2 for lm in lemmas if lm.proved]
        app.lemma_axioms |= {a for lm in lemmas if lm.proved for a in lm.axioms}
        app.congruences += cut_table.congruences
        for r in diffs:
            app.obligations.append(_output_obligation(pass_, fb, fa, r, table, cut_table, lemmas, constants,
                                                      timeout, seed, runs, search))
    if not app.obligations:
        app.vacuous = _vacuous_reason(before, after)
    if app.unknown and search != "refuter":
        unrolled = _with_loops_unrolled(pass_, before, after, timeout, seed, search)
        if unrolled is not None and len(unrolled.unknown) < len(app.unknown):
            app = unrolled
    app.seconds = time.perf_counter() - start
    return app


VERIFY_UNROLL_BUDGET = 20_000
"""Ops the verifier unrolls loops into when pairing them failed (iterations times body ops)."""


def _with_loops_unrolled(pass_: Pass, before: Module, after: Module, timeout: float, seed: int, search: str
                         ) -> Application | None:
    """The application checked on both modules with every loop unrolled at its trip count, the loop's
    meaning iteration by iteration (``cuvil.ir.unroll``, tested against ``iterate`` bit for bit): what
    decides a pass that restructures a loop (unrolls it, moves work across its boundary), where the
    loops cannot be paired. None when there is no loop, or one has a symbolic count or is too long."""
    if not (module_has_loops(before) or module_has_loops(after)):
        return None
    try:
        flat_b, flat_a = unroll_module(before, VERIFY_UNROLL_BUDGET), unroll_module(after, VERIFY_UNROLL_BUDGET)
    except (UnsupportedOpError, BudgetError):
        return None
    alt = check_application(pass_, flat_b, flat_a, timeout=timeout, seed=seed, search=search)
    note = "checked with every loop unrolled at its trip count"
    alt.obligations = [replace(o, notes=(*o.notes, note)) for o in alt.obligations]
    alt.before_hash, alt.after_hash = module_hash(before), module_hash(after)
    if not alt.obligations:
        alt.vacuous = "every result is structurally identical once the loops are unrolled at their trip counts"
    return alt


def _vacuous_reason(before: Module, after: Module) -> str:
    """What an application without obligations changed (nothing that carries meaning)."""
    changed = sorted(k for k in {*before.metadata, *after.metadata}
                     if before.metadata.get(k) != after.metadata.get(k))
    if changed:
        return ("only module metadata changed (" + ", ".join(changed) + "); code generation does not read it")
    if {f.name for f in after.functions} - {f.name for f in before.functions}:
        return "only functions were added; every existing result is identical"
    return "every result is structurally identical"


def _structural(pass_: Pass, function: str, output: str, check: str, before: str, after: str,
                note: str) -> ObligationRecord:
    """A refutation by a difference in the module's structure (no inputs to replay)."""
    ce = Counterexample(output, (), "", before, after, [], check, replayed=False, note=note)
    return _record(pass_, function, output, Refuted(ce))


def _record(pass_: Pass, function: str, output: str, verdict: Verdict) -> ObligationRecord:
    return ObligationRecord(pass_.name, str(pass_.contract), function, output, (0, 0), "-", verdict, 0.0)


def _inputs(table: LeafTable, roots: Sequence[Value]) -> list[Leaf]:
    seen: dict[str, Leaf] = {}
    for root in roots:
        _, leaves = table.cone(root)
        for leaf in leaves:
            if leaf.kind in INPUT_KINDS:
                seen.setdefault(leaf.key, leaf)
    return list(seen.values())


def _output_obligation(pass_: Pass, fb: Function, fa: Function, r: int, table: LeafTable, cut_table: LeafTable,
                       lemmas: list[Lemma], constants: dict, timeout: float, seed: int,
                       runs: Evaluations | None = None, search_mode: str = "both") -> ObligationRecord:
    start = time.perf_counter()
    vb, va = fb.results[r], fa.results[r]
    name = fb.result_names[r]
    contract = pass_.contract
    cone_b, _ = table.cone(vb)
    cone_a, _ = table.cone(va)
    size = (len(cone_b), len(cone_a))
    notes: list[str] = list(table.notes)
    used = [lm for lm in lemmas if lm.proved]
    if used:
        notes.append(f"{len(used)} cut-point lemmas proved ({sum(lm.seconds for lm in lemmas):.3f} s)")
    if vb.type != va.type:
        ce = Counterexample(name, (), "", str(vb.type), str(va.type), [], "type check", replayed=False,
                            note="the pass changed the result's type")
        return ObligationRecord(pass_.name, str(contract), fb.name, name, size, "-", Refuted(ce),
                                time.perf_counter() - start)
    encoder = ENCODER_FOR[contract]
    inputs = _inputs(table, (vb, va))
    decode = inputs if encoder == "real" else ()
    fallback: Attempt | None = None
    if search_mode == "refuter":
        attempt = Attempt("unknown", encoder, 0.0, reason="no proof attempted (refuter only)")
    else:
        attempt = _prove_opening(vb, va, cut_table, encoder, fb, timeout)
        if attempt.status != "proved" and used:
            # without the lemmas: a direct attempt can decode a model over the original cut
            attempt = prove(vb, va, table.leaf_of, encoder, fb.constraints, timeout=timeout, decode=decode)
        elif attempt.status == "sat" and decode:
            attempt = prove(vb, va, table.leaf_of, encoder, fb.constraints, timeout=timeout, decode=decode)
        if attempt.status != "proved" and contract is Contract.EXACT:
            fallback = prove(vb, va, table.leaf_of, "real", fb.constraints, timeout=timeout, decode=inputs)
    cones = ConeFunctions(inputs, cone_function("before", vb, inputs, table.leaf_of, fb.constraints),
                          cone_function("after", va, inputs, table.leaf_of, fa.constraints))
    case = ObligationCase(fb, fa, r, constants, cones, contract, name, table.leaf_of)
    proved = attempt.status == "proved"
    model_source = attempt if attempt.model_inputs is not None else fallback
    search = Refuter(case, seed, runs).search(model_source, full=not proved, float_search=search_mode != "prover",
                                              more_models=(attempt, fallback))
    enc_name = encoder if attempt.has_float else "int"
    shapes = (f"{name}: {vb.type}", *(f"{leaf.label}: {leaf.type}" for leaf in inputs[:8]),
              *(str(c) for c in fb.constraints))
    verdict = _combine(attempt, fallback, search, contract, enc_name, shapes, notes)
    if search.rit_differs is not None:
        differs = "the cones differ" if search.rit_differs else "agree"
        if search.rit_differs and proved and not _rit_applies(attempt, search):
            differs += " (it has no bit patterns for floats, which this proof reads)"
        notes.append("randomized identity test over Z_p: " + differs)
    seconds = time.perf_counter() - start
    if isinstance(verdict, Proved):
        verdict = Proved(verdict.encoder, verdict.shapes, seconds, verdict.axioms, verdict.note)
    return ObligationRecord(pass_.name, str(contract), fb.name, name, size, enc_name, verdict, seconds, shapes,
                            tuple(notes), query=attempt.smt2 if isinstance(verdict, Proved) else "")


LEMMA_RLIMIT = 20_000_000
"""z3 resource limit of one cut-point lemma (deterministic, unlike a time limit; an unproved
lemma only costs a larger later obligation). The obligation's time limit still applies."""

SWEEP_MIN_OPS = 6
"""Functions with fewer ops are proved in one obligation, without cut points."""


@dataclass
class Lemma:
    """``before`` and ``after`` compute the same tensor, given the cut below them."""

    before: str
    after: str
    proved: bool
    seconds: float
    smt2: str = ""
    axioms: tuple[str, ...] = ()


def _close(x: np.ndarray, y: np.ndarray, rtol: float) -> bool:
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    if x.dtype.kind not in "fc":
        return bool(np.array_equal(x, y))
    with np.errstate(all="ignore"):
        a, b = x.astype(np.float64), y.astype(np.float64)
        nan = np.isnan(a) | np.isnan(b)
        if np.any(np.isnan(a) != np.isnan(b)):
            return False
        a, b = np.where(nan, 0.0, a), np.where(nan, 0.0, b)
        scale = float(np.max(np.abs(a), initial=0.0))
        return bool(np.all(np.abs(a - b) <= rtol * scale + 1e-300))


_SAMPLES = 32


def _sample(x: np.ndarray) -> np.ndarray:
    flat = np.asarray(x).reshape(-1)
    pick = flat[np.linspace(0, flat.size - 1, min(_SAMPLES, flat.size)).astype(np.int64)] if flat.size else flat
    return pick.astype(np.float64) if pick.dtype.kind in "fc" or pick.dtype.name == "bfloat16" else pick


def _scale(x: np.ndarray) -> float:
    if x.dtype.kind not in "fc":
        return 0.0
    with np.errstate(all="ignore"):
        a = np.abs(x.astype(np.float64))
        return float(np.max(np.where(np.isnan(a), 0.0, a), initial=0.0))


def _maybe_close(sb: np.ndarray, scale_b: float, sa: np.ndarray, rtol: float) -> bool:
    """A necessary condition of ``_close`` read at a few fixed positions (``scale_b``: the whole
    before tensor's), so most pairs are rejected without a pass over whole tensors."""
    if sb.shape != sa.shape:
        return False
    if sb.dtype.kind != "f":
        return bool(np.array_equal(sb, sa))
    with np.errstate(all="ignore"):
        nb, na = np.isnan(sb), np.isnan(sa)
        if np.any(nb != na):
            return False
        return bool(np.all(np.abs(np.where(nb, 0.0, sb) - np.where(na, 0.0, sa)) <= rtol * scale_b + 1e-300))


def _signatures(runs: Evaluations, side: str, wide: bool) -> tuple[dict[Value, np.ndarray], bool]:
    """Every value of one side on the random inputs; in float64 when ``wide`` and the function
    admits it (real contracts: rounding would hide real agreement). Exact contracts use the real
    dtypes, where a folded constant equals its expression bit for bit."""
    if wide:
        memo = runs.values(side, "random", wide=True)
        if memo is not None:
            return memo, True
    return runs.values(side, "random") or {}, False


def _sweep(fb: Function, fa: Function, table: LeafTable, runs: Evaluations, encoder: str, timeout: float,
           bodies: BodyProofs | None = None) -> list[Lemma]:
    """Cut points: pairs of values that agree on a random input are proved equal bottom-up (each
    given the pairs below it); proved pairs become shared leaves, so every later obligation,
    the outputs' included, only spans the ops between two cuts."""
    lemmas = _congruent_cuts(fb, fa, table, encoder, timeout, bodies)
    dep_b, dep_a = param_dependent(fb.values()), param_dependent(fa.values())
    cand_b = [v for v in fb.values() if v in dep_b and not v.is_param and table.leaf_of(v) is None]
    cand_a = [v for v in fa.values() if v in dep_a and not v.is_param and table.leaf_of(v) is None]
    if len(cand_a) + len(cand_b) < SWEEP_MIN_OPS:
        return lemmas
    wide = encoder == "real"
    sig_b, wide_b = _signatures(runs, "before", wide)
    sig_a, wide_a = _signatures(runs, "after", wide)
    rtol = 1e-9 if wide_b and wide_a else 1e-5
    by_type: dict[object, list[Value]] = {}
    by_view: dict[object, list[Value]] = {}
    for v in cand_b:
        if v in sig_b:
            by_type.setdefault(v.type, []).append(v)
            by_view.setdefault(_view_key(v), []).append(v)
    ctx = z3.Context()
    tried: set[tuple[Value, Value]] = set()
    quick: dict[Value, tuple[np.ndarray, float]] = {}
    by_op = _by_op(fb, table)
    place_b, place_a = _places(fb), _places(fa)
    users = fb.users()
    attempted: dict[Value, tuple[object, ...]] = {}
    """Per after-value, its operands' leaves when its pairs were last tried: tried again only once they change."""
    for _ in range(SWEEP_ROUNDS):
        cut = sum(table.leaf_of(va) is not None for va in cand_a)
        lemmas += _layout_chains(cand_b, users, sig_b, sig_a, fa, table, encoder, fb, timeout, ctx, rtol, tried)
        for va in cand_a:
            if table.leaf_of(va) is not None or _congruent(va, by_op, table, bodies):
                continue
            arr = sig_a.get(va)
            keys = _operand_keys(va, table)
            if arr is None or attempted.get(va) == keys:
                continue
            attempted[va] = keys
            tries = 0
            sample_a = _sample(arr)
            # a signature of one repeated value matches every other one of that value: its pairs are guesses,
            # tried nearest in program order first (after the same op), each for a short time
            guess = _uniform(arr)
            budget = timeout * GUESS_SHARE if guess else timeout
            here = place_a[va]
            for vb in sorted(by_type.get(va.type, []),
                             key=lambda u, here=here: (u.op != va.op, abs(place_b[u] - here) if guess else 0.0)):
                if vb not in quick:
                    quick[vb] = (_sample(sig_b[vb]), _scale(np.asarray(sig_b[vb])))
                if not _maybe_close(*quick[vb], sample_a, rtol) or not _close(sig_b[vb], arr, rtol):
                    continue
                lemma = _lemma(vb, va, table, encoder, fb, budget, ctx)
                lemmas.append(lemma)
                if lemma.proved:
                    break
                tries += 1
                if tries >= 2:
                    break
            if table.leaf_of(va) is None:
                lemmas += _view_lemmas(va, arr, by_view.get(_view_key(va), []), sig_b, table, encoder, fb,
                                       timeout, ctx, rtol)
        if sum(table.leaf_of(va) is not None for va in cand_a) == cut:
            break
    return lemmas


SWEEP_ROUNDS = 16
"""How many times the sweep goes over the after-values while its cut grows. A pair whose cone reached down to
an uncut region can be proved once the cut grows below it: a value is tried again when its operands' leaves
changed, and an identity layout chain of the before side once the value it returns to joined the cut. A
network that runs every block's tokens through a reshape round trip (TimeSformer's divided attention) needs
about one round per block."""


GUESS_SHARE = 0.125
"""The share of a lemma's time limit given to a pair whose random signature is one value repeated (all zeros:
a model whose activations vanish on random inputs, MobileViT at its library's initialization; or one
constant, a path that normalization or a dead branch made independent of the inputs): such pairs are
guesses, and a wrong one would otherwise spend the whole limit."""


def _uniform(arr: np.ndarray) -> bool:
    """Whether a signature is all zeros, or one value in every element of a tensor of several."""
    a = np.asarray(arr)
    if not np.any(a):
        return True
    return a.size > 1 and bool(np.all(a == a.flat[0]))


def _places(fn: Function) -> dict[Value, float]:
    """Each value's place in ``fn``'s program order, as a fraction of its length."""
    values = fn.values()
    return {v: k / max(len(values) - 1, 1) for k, v in enumerate(values)}


def _view_key(v: Value) -> tuple[object, ...]:
    """A value's dtype and its extents other than the unit ones: values that are views of one another
    (:func:`unit_view`) share it."""
    return (v.dtype, tuple(str(d) for d in non_unit_extents(v.type.shape)))


def _view_lemmas(va: Value, arr: np.ndarray, candidates: list[Value], sig_b: Mapping[Value, np.ndarray],
                 table: LeafTable, encoder: str, fb: Function, timeout: float, ctx: z3.Context,
                 rtol: float) -> list[Lemma]:
    """Cut points where a pass squeezed or unsqueezed unit axes (MobileViT's patches, eliminated layout
    ops): ``va`` and a before-value that is it with unit axes added or dropped, equal element for element on
    the random inputs, are proved one tensor in two views; the pair then reads one leaf, each side through
    its own shape (:func:`verify.cone_encoder.view_index`). Without it nothing above the squeeze pairs."""
    lemmas: list[Lemma] = []
    for vb in candidates:
        if table.leaf_of(vb) is not None or not unit_view(va.type.shape, vb.type.shape):
            continue
        if not _close(np.asarray(sig_b[vb]).reshape(np.shape(arr)), np.asarray(arr), rtol):
            continue
        lemma = _lemma(vb, va, table, encoder, fb, timeout, ctx)
        lemmas.append(lemma)
        if lemma.proved or len(lemmas) >= 2:
            break
    return lemmas


LAYOUT_OPS = frozenset({"reshape", "transpose", "expand", "slice", "concat", "gather", "tile"})
"""Ops that only move elements: a chain of them may be the identity on a value both sides read."""


def _layout_chains(cand_b: list[Value], users: Mapping[Value, list[Value]], sig_b: Mapping[Value, np.ndarray],
                   sig_a: Mapping[Value, np.ndarray], fa: Function, table: LeafTable, encoder: str, fb: Function,
                   timeout: float, ctx: z3.Context, rtol: float, tried: set[tuple[Value, Value]]) -> list[Lemma]:
    """Cut points where the pass removed a chain of layout ops that is the identity (a reshape, a
    transpose of a unit axis and the reshape back, as Swin's export writes): the chain's last value pairs
    with no value of the other side, which reads the value both sides share (or one the cut already pairs)
    instead. Each such pair is a lemma (index arithmetic only); proved, the ops that read it meet the same
    leaf on both sides and are cut by congruence, where otherwise every obligation above compared two
    reductions over different index expressions."""
    shared: dict[object, list[Value]] = {}
    for u in fa.values():
        leaf = table.leaf_of(u)
        if leaf is not None and leaf.kind in ("shared", "param", "cut") and u in sig_a:
            shared.setdefault(u.type, []).append(u)
    lemmas: list[Lemma] = []
    if not shared:
        return lemmas
    for vb in cand_b:
        arr = sig_b.get(vb)
        if vb.op not in LAYOUT_OPS or arr is None or table.leaf_of(vb) is not None:
            continue
        if any(o.op in LAYOUT_OPS and table.leaf_of(o) is None for o in users.get(vb, [])):
            continue  # not the chain's last value
        budget = timeout * GUESS_SHARE if _uniform(arr) else timeout
        for u in shared.get(vb.type, []):
            if (vb, u) not in tried and _close(arr, sig_a[u], rtol):
                tried.add((vb, u))
                lemma = _lemma(vb, u, table, encoder, fb, budget, ctx)
                lemmas.append(lemma)
                if lemma.proved:
                    break
    return lemmas


def _lemma(vb: Value, va: Value, table: LeafTable, encoder: str, fb: Function, timeout: float,
           ctx: z3.Context) -> Lemma:
    """Prove one cut-point pair given the cut below it; a proved pair joins the cut."""
    attempt = _prove_opening(vb, va, table, encoder, fb, timeout, ctx=ctx, rlimit=LEMMA_RLIMIT)
    if attempt.status == "proved":
        table.add_cut(vb, va)
    return Lemma(vb.op, va.op, attempt.status == "proved", attempt.seconds, attempt.smt2, attempt.axioms)


def _congruent_cuts(fb: Function, fa: Function, table: LeafTable, encoder: str, timeout: float,
                    bodies: BodyProofs | None = None) -> list[Lemma]:
    """Cut points by congruence, bottom-up: an after-value with the op, attributes and type of a
    before-value whose operands are pairwise the same leaves computes the same tensor (ops are pure
    functions), so the pair becomes a cut without a query; with the operands of a commutative op
    swapped, the pair is proved like any lemma (the op's flag is not trusted). A rewrite near the
    inputs (a reordered product) then leaves every obligation the few ops between two cuts instead of
    the whole network downstream of it. Two loops whose bodies differ join the cut when their bodies
    are proved equal (``bodies``)."""
    by_op = _by_op(fb, table)
    lemmas: list[Lemma] = []
    ctx = z3.Context()
    for va in fa.values():
        if va.is_param or va.is_const or table.leaf_of(va) is not None:
            continue
        ops = _operand_keys(va, table)
        if None in ops:
            continue
        if _congruent(va, by_op, table, bodies):
            continue
        for vb in by_op.get(_op_key(va), []):
            if table.leaf_of(vb) is not None or vb.attrs != va.attrs:
                continue
            ops_b = _operand_keys(vb, table)
            if None in ops_b or sorted(ops_b, key=str) != sorted(ops, key=str):
                continue
            lemma = _lemma(vb, va, table, encoder, fb, timeout, ctx)
            lemmas.append(lemma)
            if lemma.proved:
                break
    return lemmas


def _op_key(v: Value) -> tuple[object, ...]:
    """Op, attributes and type; a structured op's body left out (bodies are compared by proof)."""
    if v.op in REGION_ATTRS:
        return (v.op, tuple((k, a) for k, a in v.attrs if k not in REGION_ATTRS[v.op]), v.type)
    return (v.op, v.attrs, v.type)


REGION_ATTRS = {"loop": ("body",), "cond": ("then_body", "else_body")}
"""The attributes of a structured op that hold its regions."""


def _by_op(fb: Function, table: LeafTable) -> dict[tuple[object, ...], list[Value]]:
    """The before-values not yet in the cut, by :func:`_op_key`."""
    by_op: dict[tuple[object, ...], list[Value]] = {}
    for vb in fb.values():
        if not (vb.is_param or vb.is_const or table.leaf_of(vb) is not None):
            by_op.setdefault(_op_key(vb), []).append(vb)
    return by_op


def _operand_keys(v: Value, table: LeafTable) -> tuple[tuple[str, str] | None, ...]:
    """Each operand's leaf and type: one leaf can be read through views of different shapes."""
    leaves = [table.leaf_of(o) for o in v.operands]
    return tuple((leaf.key, str(o.type)) if leaf is not None else None for leaf, o in zip(leaves, v.operands,
                                                                                        strict=True))


def _congruent(va: Value, by_op: dict[tuple[object, ...], list[Value]], table: LeafTable,
               bodies: BodyProofs | None = None) -> bool:
    """Join ``va`` to the cut with a before-value of the same op, attributes and type whose operands
    are the same leaves (the cut grows during the sweep: a loop, which is encoded only so, joins once
    its operands are proved equal). Two loops whose bodies differ join when ``bodies`` proves them
    equal (see :class:`BodyProofs`)."""
    ops = _operand_keys(va, table)
    for vb in by_op.get(_op_key(va), []):
        if table.leaf_of(vb) is not None:
            continue
        if vb.attrs == va.attrs and None not in ops and _operand_keys(vb, table) == ops:
            table.add_cut(vb, va, "congruence: the same op, attributes and operand leaves")
            return True
        if va.op in REGION_ATTRS and bodies is not None and bodies.regions_equal(vb, va, table):
            why = "bodies equal" if va.op == "loop" else "both branches equal"
            table.add_cut(vb, va, f"{va.op}: operands the same leaves, {why} (the loop_body obligations)")
            return True
    return False


@dataclass
class BodyProofs:
    """Two loops compute the same results when their operands other than constant invariants are the
    same leaves and their bodies, with the constant invariants read in place (``open_body``), are
    proved equal as functions of the remaining arguments: each iteration then maps equal state to
    equal state, so by induction on the iterations every result is equal, whatever the trip count.
    A pair of bodies is checked like a pair of functions (the outer function's constraints on their
    dims), by the same obligations as the pass's own, under the same contract. A bounded contract's
    error may grow with the iterations, so it never pairs loops."""

    pass_: Pass
    outer: Function
    constants: tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]]
    timeout: float
    seed: int
    search: str
    checked: dict[tuple[tuple[int, ...], tuple[int, ...]], Application] = field(default_factory=dict)

    def regions_equal(self, vb: Value, va: Value, table: LeafTable) -> bool:
        """Whether the two loops (or conds) are proved to compute the same results: operands the same
        leaves and each region of one proved equal to the other's, as functions of its arguments (two
        conds then run equal branches on equal operands, whichever the condition picks)."""
        if self.pass_.contract is Contract.BOUNDED:
            return False
        regions_b, ops_b = open_regions(vb)
        regions_a, ops_a = open_regions(va)
        keys_b = [table.leaf_of(o) for o in ops_b]
        keys_a = [table.leaf_of(o) for o in ops_a]
        if None in keys_b or None in keys_a or [k.key for k in keys_b if k] != [k.key for k in keys_a if k] \
                or [o.type for o in ops_b] != [o.type for o in ops_a]:
            return False
        return all(self._region_equal(rb, ra) for rb, ra in zip(regions_b, regions_a, strict=True))

    def _region_equal(self, region_b: tuple[list[Value], list[Value]], region_a: tuple[list[Value], list[Value]]
                      ) -> bool:
        (args_b, results_b), (args_a, results_a) = region_b, region_a
        if [a.type for a in args_b] != [a.type for a in args_a]:
            return False
        if results_b == results_a:
            return True
        key = (tuple(map(id, results_b)), tuple(map(id, results_a)))
        if key not in self.checked:
            before = Module((body_function(args_b, results_b, self.outer),), self.constants[0])
            after = Module((body_function(args_a, results_a, self.outer),), self.constants[1])
            self.checked[key] = check_application(self.pass_, before, after, timeout=self.timeout, seed=self.seed,
                                                  search=self.search)
        return self.checked[key].proved

    def record(self, app: Application, table: LeafTable) -> None:
        """Proved bodies join the application's obligations (the certificate shows them); a pair
        not proved is a note on the outputs, never a refutation: a body may differ on states the
        loop never reaches."""
        for sub in self.checked.values():
            if sub.proved:
                app.obligations += [replace(o, function=f"{self.outer.name}/{o.function}") for o in sub.obligations]
                app.lemmas += sub.lemmas
                app.lemma_axioms |= sub.lemma_axioms
                app.congruences += sub.congruences
            else:
                why = "; ".join(f"{o.output}: {o.status}" for o in sub.obligations) or "no obligation"
                table.notes.append(f"a loop body or branch the pass rewrote was not proved equal ({why})")


def _prove_opening(vb: Value, va: Value, table: LeafTable, encoder: str, fb: Function, timeout: float,
                   ctx: z3.Context | None = None, rlimit: int | None = None) -> Attempt:
    """Prove with the cut as it is; when the encodings can differ, again looking through the
    shared values only one side reads, then through every shared value one and two levels deep."""
    roots = _roots_read(table.leaf_of, vb, va)
    if roots is not table.leaf_of and _reads_root_leaf(table, vb, va):
        # a root that already joined the cut, whose leaf the other cone reads: first as that leaf (``va`` may
        # be the value it was paired with plus a zero bias: fold-batchnorm's convolution and its bias add)
        first = prove(vb, va, table.leaf_of, encoder, fb.constraints, timeout=timeout, ctx=ctx, rlimit=rlimit)
        if first.status == "proved":
            return first
    attempt = prove(vb, va, roots, encoder, fb.constraints, timeout=timeout, ctx=ctx, rlimit=rlimit)
    for eager in (0, 1, 2):
        if attempt.status != "sat":
            return attempt
        retry = prove(vb, va, _roots_read(table.opened(vb, va, eager=eager), vb, va), encoder, fb.constraints,
                      timeout=timeout, ctx=ctx, rlimit=rlimit)
        if retry.status == "proved":
            return retry
        if retry.status == "sat":
            attempt = retry  # its model is over a more precise encoding (fewer opaque shared values)
    return attempt


def _reads_root_leaf(table: LeafTable, vb: Value, va: Value) -> bool:
    """Whether one root is a leaf that the other root's cone (down to its leaves) reads."""
    for root, other in ((vb, va), (va, vb)):
        leaf = table.leaf_of(root)
        if leaf is not None and leaf.key in table.leaf_values(other, table.leaf_of):
            return True
    return False


def _roots_read(lookup: Callable[[Value], Leaf | None], vb: Value, va: Value) -> Callable[[Value], Leaf | None]:
    """``lookup`` with a root that is a cut-point leaf read by its rule (a loop or cond has none: it is
    encoded only as a cut), unless both roots are the same leaf. A root can be a cut already: an output
    whose before-value a lemma paired with some other after-value (a mean over a unit axis with the value
    it averages). Read as that leaf it relates to nothing the other side reads; read by its rule it meets
    the leaves below both roots."""
    leaf_b, leaf_a = lookup(vb), lookup(va)
    if leaf_b is leaf_a:
        return lookup
    opened = [v for v, leaf in ((vb, leaf_b), (va, leaf_a))
              if leaf is not None and leaf.kind == "cut" and not get_op(v.op).structured]
    if not opened:
        return lookup
    return lambda v: None if any(v is u for u in opened) else lookup(v)


def _float_only(ce: Counterexample) -> bool:
    """A difference in whether the result is finite: rounding/overflow, not real arithmetic."""
    def finite(x: Any) -> bool:
        return isinstance(x, (bool, int)) or math.isfinite(float(x))
    return finite(ce.before) != finite(ce.after)


def _combine(attempt: Attempt, fallback: Attempt | None, search: Search, contract: Contract, encoder: str,
             shapes: tuple[str, ...], notes: list[str]) -> Verdict:
    ce = search.counterexample
    if attempt.status == "proved":
        if ce is not None and contract is Contract.REAL:
            if _float_only(ce):  # NaN or infinity on one side only: outside what a real proof covers
                notes.append("equal over the reals, but not in floating point at these inputs")
                return Refuted(ce)
            # finite on both sides: a rounding difference, which the real contract admits (float64,
            # the search's reference, rounds too, so it cannot tell a real difference from this)
            notes.append(f"differs by rounding at some inputs ({ce.before} vs {ce.after}), as real admits")
        elif ce is not None:
            raise VerifierInconsistency(
                f"an obligation was proved ({attempt.encoder}) and refuted by a replayed counterexample:\n"
                f"{ce.table()}", location=ce.output)
        if search.rit_differs and _rit_applies(attempt, search):
            raise VerifierInconsistency(
                f"an obligation was proved ({attempt.encoder}) but the cones differ under randomized identity "
                f"testing at index {search.rit_index}", location=shapes[0] if shapes else None)
        return Proved(encoder, shapes, attempt.seconds, attempt.axioms, attempt.reason)
    if ce is not None:
        return Refuted(ce)
    details = tuple(search.tried)
    if fallback is not None and fallback.status == "proved":
        return Unknown("equal over the reals only: relies on real arithmetic, not proved bit-exact", details)
    reason = attempt.reason or attempt.status
    if attempt.status == "sat":
        reason = f"not proved ({attempt.encoder}): the encodings can differ, but no concrete counterexample replays"
    if search.rit_differs:
        trace = search.rit_trace
        if trace is not None and trace.homomorphic:
            reason += f"; randomized identity testing over Z_p finds a difference at {search.rit_index}"
        else:  # sqrt, exp, comparisons...: random oracles in Z_p, where equal real expressions can differ
            used = ", ".join(sorted(trace.oracles)) if trace is not None and trace.oracles else "comparisons"
            reason += (f"; randomized identity testing over Z_p differs, which says nothing here: the cones "
                       f"leave field arithmetic ({used})")
    return Unknown(reason, details)


def _rit_applies(attempt: Attempt, search: Search) -> bool:
    """Whether a Z_p disagreement contradicts this proof: never when it read a float's bits exactly (a
    chain of bitcasts, a literal's encoding: Z_p has no bit patterns for floats); otherwise always for
    abstract-fp (its laws hold in the Z_p reading); for a real proof only when the evaluation stayed
    inside field arithmetic."""
    if any(a in _NOT_IN_Z_P for a in attempt.axioms):
        return False
    if attempt.encoder == "abstract-fp":
        return True
    trace = search.rit_trace
    return trace is not None and trace.homomorphic and not any(a in _NON_FIELD_AXIOMS for a in attempt.axioms)
