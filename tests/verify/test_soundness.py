"""The word "proved" is a proof: what the prover alone catches, what it never proves, and a mutation
test of the verifier itself (disable its handling of one feature and the corpus fails)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from prover_only_passes import PROVER_ONLY
from soundness_passes import NEVER_PROVED, SEEDED
from wrong_passes import CORPUS as CLASSIC

from cuvil.interp import run_reference
from cuvil.ir import Builder, DType
from cuvil.ir.types import DimConstraint
from cuvil.passes import Contract
from verify import check_pass, check_rewrite
from verify.errors import VerifierInconsistency

ALL_SEEDED = {**CLASSIC, **PROVER_ONLY, **SEEDED}
MIN_PROVER_ONLY = 15


@functools.cache
def _statuses(name: str, search: str) -> tuple[str, ...]:
    pass_, make = {**ALL_SEEDED, **NEVER_PROVED}[name]
    return tuple(o.status for o in check_pass(pass_, make(), search=search).obligations)


def test_the_prover_catches_at_least_15_bugs_random_testing_misses():
    """Measured, not declared: each entry is checked by the refuter alone (no proof attempt)."""
    missed_by_refuter = sorted(n for n in ALL_SEEDED if "refuted" not in _statuses(n, "refuter"))
    assert len(ALL_SEEDED) >= 45
    assert len(missed_by_refuter) >= MIN_PROVER_ONLY, missed_by_refuter
    assert set(PROVER_ONLY) <= set(missed_by_refuter), "a bug filed as prover-only is found by random testing"
    for name in missed_by_refuter:
        assert "refuted" in _statuses(name, "both"), name


# Under a ``real`` contract NaN, infinities and overflow lie outside the proof (the certificate
# says so); the special-value search refutes those bugs (tests/verify/test_wrong_passes.py).
EXACT_SEEDED = sorted(n for n, (p, _) in ALL_SEEDED.items() if p.contract is Contract.EXACT)


@pytest.mark.parametrize("name", EXACT_SEEDED)
def test_without_the_float_search_no_seeded_bug_is_proved(name):
    """The prover alone: every seeded bug is refuted (from a z3 model) or unknown, never proved."""
    statuses = _statuses(name, "prover")
    assert "refuted" in statuses or (statuses and set(statuses) <= {"unknown"}), statuses


@pytest.mark.parametrize("name", sorted(PROVER_ONLY))
def test_prover_only_bugs_are_refuted_from_z3_models(name):
    assert "refuted" in _statuses(name, "prover")


@pytest.mark.parametrize("name", sorted(NEVER_PROVED))
def test_unchecked_parts_and_silent_changes_are_never_proved(name):
    pass_, make = NEVER_PROVED[name]
    report = check_pass(pass_, make())
    assert report.applications, "the change in content reaches the verifier"
    statuses = [o.status for o in report.obligations]
    assert "proved" not in statuses
    if name == "metadata-only":
        (app,) = report.applications
        assert app.vacuous and not app.proved and not statuses
        assert report.certificate()["summary"]["vacuous_applications"] == 1
    else:
        assert "refuted" in statuses


def test_a_sum_written_as_a_matmul_is_proved_and_the_interpreter_agrees_bit_for_bit():
    """The historical example: reduce_sum(x) over K and matmul(x, ones[K, 1]) sum the same products
    in the same order now that every reader folds in the rule's order, so the proof is true."""

    def model(as_matmul: bool):
        b = Builder()
        x = b.param("x", DType.f32, [3, "K"])
        if as_matmul:
            ones = b.expand(b.const(np.ones((1, 1), np.float32)), shape=["K", 1])
            out = b.reshape(b.matmul(x, ones), shape=[3])
        else:
            out = b.reduce_sum(x, axes=[1], keepdims=False)
        return b.module(b.function("main", [x], [out], constraints=[DimConstraint("K", lo=1, hi=4096)]))

    report = check_rewrite(model(False), model(True))
    assert [o.status for o in report.obligations] == ["proved"]
    rng = np.random.default_rng(0)
    for k in (1, 2, 12, 13, 100, 1000):
        x = (rng.standard_normal((3, k)) * 10.0 ** rng.integers(-3, 4, (3, k))).astype(np.float32)
        a, b = run_reference(model(False), [x])[0], run_reference(model(True), [x])[0]
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), k


# --------------------------------------------------------------------------------------
# mutation test of the verifier: each feature, disabled, lets a seeded bug through


def _caught(names, search: str = "prover") -> dict[str, tuple[str, ...]]:
    out = {}
    for name in names:
        pass_, make = {**ALL_SEEDED, **NEVER_PROVED}[name]
        try:
            out[name] = tuple(o.status for o in check_pass(pass_, make(), search=search).obligations)
        except VerifierInconsistency:  # the full verifier catching its own unsound prover
            out[name] = ("inconsistent",)
    return out


def _corpus_fails(results: dict[str, tuple[str, ...]]) -> bool:
    return any("refuted" not in statuses for statuses in results.values())


def _prover_unsound(names, monkeypatch_apply) -> dict[str, tuple[str, ...]]:
    """Baseline: the full verifier refutes every entry. Mutated: the prover alone proves one."""
    assert not _corpus_fails(_caught(names, "both"))
    monkeypatch_apply()
    results = _caught(names, "prover")
    assert _corpus_fails(results) and any("proved" in s for s in results.values()), results
    return results


def test_mutation_integer_wrap(monkeypatch):
    """Keep index arithmetic unbounded whatever its dtype (the old encoder)."""
    from verify import cone_encoder

    _prover_unsound(["wrapping-index-math-inside-one-fused-rule"], lambda: monkeypatch.setattr(
        cone_encoder.ConeEncoder, "_index_int",
        lambda self, lin, dtype: cone_encoder.IndexInt(lin) if dtype.is_int else None))


def test_mutation_empty_extents(monkeypatch):
    from verify import cone_encoder

    _prover_unsound([n for n in PROVER_ONLY if "empty" in n], lambda: monkeypatch.setattr(
        cone_encoder.ConeEncoder, "_empty_extent_guard", lambda self, kind, dt, extents, out: out))


def test_mutation_signed_zero(monkeypatch):
    """Let the encoder drop ``x + 0.0`` (not an identity: -0.0 + 0.0 is +0.0)."""
    from verify.scalar_semantics import AbstractFPSemantics

    original = AbstractFPSemantics._is_lit
    _prover_unsound(["x-plus-zero-removed"], lambda: monkeypatch.setattr(
        AbstractFPSemantics, "_is_lit", lambda self, t, value, negative=None: original(self, t, value, None)))


def test_mutation_nan(monkeypatch):
    """Encode max(a, b) as a select on a > b, forgetting that NaN propagates through max."""
    from verify.scalar_semantics import AbstractFPSemantics

    original = AbstractFPSemantics.float_call

    def nan_blind(self, fn, args, dtype):
        if fn == "max":
            return self.select(original(self, "gt", args, dtype), args[0], args[1], dtype)
        return original(self, fn, args, dtype)

    _prover_unsound(["relu-as-select"], lambda: monkeypatch.setattr(AbstractFPSemantics, "float_call", nan_blind))


def test_mutation_regions(monkeypatch):
    """Hash a fused op's region by its shape only (the old bug): the body changes go unseen."""
    import weakref

    from cuvil.ir import hashing
    from cuvil.ir.region import Region

    names = [n for n in SEEDED if n.startswith("fused-body")]
    assert not _corpus_fails(_caught(names, "both"))
    original = hashing.attr_digest
    monkeypatch.setattr(hashing, "attr_digest", lambda a: ("region", str(a)) if isinstance(a, Region)
                        else original(a))
    monkeypatch.setattr(hashing, "_cache", weakref.WeakKeyDictionary())
    assert _corpus_fails(_caught(names, "both"))


def test_mutation_constant_bytes(monkeypatch):
    from verify import obligations

    names = [n for n in NEVER_PROVED if "key" in n]
    assert not _corpus_fails(_caught(names, "both"))
    monkeypatch.setattr(obligations, "constant_conflicts", lambda constants: [])
    assert _corpus_fails(_caught(names, "both"))


# --------------------------------------------------------------------------------------
# determinism


_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from prover_only_passes import PROVER_ONLY
from soundness_passes import SEEDED
from wrong_passes import CORPUS
from verify import check_pass
names = {names!r}
table = {{**CORPUS, **PROVER_ONLY, **SEEDED}}
for n in names:
    p, make = table[n]
    rep = check_pass(p, make())
    print(n, [(o.status, o.encoder, len(o.query)) for o in rep.obligations])
"""


def test_verdicts_do_not_depend_on_the_hash_seed():
    """Python randomizes str hashes per process; no verdict (nor query) may depend on it."""
    names = ["x-plus-zero-removed", "i32-position-times-stride-wraps", "fused-body-add-becomes-sub",
             "bn-fold-without-eps", "softmax-without-max-shift", "max-over-empty-axis-folded"]
    script = _SCRIPT.format(tests=str(Path(__file__).parent), names=names)
    outputs = set()
    for seed in range(10):
        env = dict(os.environ, PYTHONHASHSEED=str(seed))
        run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300,
                             cwd=Path(__file__).parents[2])
        assert run.returncode == 0, run.stderr[-2000:]
        outputs.add(run.stdout)
    assert len(outputs) == 1, outputs


# --------------------------------------------------------------------------------------
# smaller holes the audit found


def _chain_model(n: int, unrolled: bool):
    b = Builder()
    x = b.param("x", DType.f32, [2, n])
    if not unrolled:
        return b.module(b.function("main", [x], [b.reduce_sum(x, axes=[1], keepdims=False)]))
    acc = None
    for k in range(n):
        t = b.reshape(b.slice(x, starts=[0, k], ends=[2, k + 1], steps=[1, 1]), shape=[2])
        acc = t if acc is None else b.add(acc, t)
    return b.module(b.function("main", [x], [acc]))


@pytest.mark.parametrize("n", [12, 20])
def test_a_sum_unrolled_in_the_rules_order_is_never_refuted(n):
    """The interpreter folds a sum left to right, as the rule says; the unrolled chain is the same
    float program (proved when short, unknown beyond the unrolling limit, never refuted)."""
    statuses = [o.status for o in check_rewrite(_chain_model(n, False), _chain_model(n, True)).obligations]
    assert statuses == ["proved"] if n <= 16 else statuses in (["proved"], ["unknown"])
    x = (np.random.default_rng(n).standard_normal((2, n)) * 100).astype(np.float32)
    a, b = run_reference(_chain_model(n, False), [x])[0], run_reference(_chain_model(n, True), [x])[0]
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_signed_integer_modulo_of_two_inputs_is_encoded():
    def model(shifted: bool):
        b = Builder()
        x, y = b.param("x", DType.i32, [4]), b.param("y", DType.i32, [4])
        lhs = b.add(x, b.scalar(0, DType.i32)) if shifted else x
        return b.module(b.function("main", [x, y], [b.mod(lhs, y)]))

    assert [o.status for o in check_rewrite(model(False), model(True)).obligations] == ["proved"]


def test_rounding_under_a_real_contract_is_not_an_inconsistency():
    """(x + 3) - 3 equals x over the reals; float64, the search's reference, rounds too, so the gap it
    sees at tiny x is no evidence against the real proof."""

    def model(folded: bool):
        b = Builder()
        x = b.param("x", DType.f32, [6])
        three = b.scalar(3.0, DType.f32)
        return b.module(b.function("main", [x], [x if folded else b.sub(b.add(x, three), three)]))

    assert [o.status for o in check_rewrite(model(False), model(True), "real").obligations] == ["proved"]


def test_unsigned_counterexample_values_stay_unsigned():
    def model(wrong: bool):
        b = Builder()
        x = b.param("x", DType.u8, [4])
        big = b.scalar(200, DType.u8)
        return b.module(b.function("main", [x], [b.greater(x, big) if not wrong else b.less(x, big)]))

    (o,) = check_rewrite(model(False), model(True)).obligations
    assert o.status == "refuted"
    for t in o.verdict.counterexample.inputs:
        assert t.value.dtype == np.uint8
