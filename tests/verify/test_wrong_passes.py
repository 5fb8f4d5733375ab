"""Seeded miscompilations: each wrong pass in the corpus (the classic miscompilations, the bugs only
the prover catches, and the ways a certificate used to lie) is refuted, and its counterexample
replays on the reference interpreter when the before and after modules are run on the
counterexample's inputs."""

import functools
import math

import numpy as np
import pytest
from prover_only_passes import PROVER_ONLY
from soundness_passes import SEEDED
from wrong_passes import CORPUS as CLASSIC

from cuvil.interp import run_reference
from cuvil.passes.base import Contract
from verify import Refuted, Verification, check_pass

MIN_CORPUS = 45
CORPUS = {**CLASSIC, **PROVER_ONLY, **SEEDED}


@functools.cache
def _report(name: str) -> Verification:
    """One check per corpus entry and process: the per-entry test and the summary share it."""
    pass_, make = CORPUS[name]
    return check_pass(pass_, make())


def _differs(before: float, after: float, contract: Contract) -> bool:
    b, a = float(before), float(after)
    if math.isnan(b) or math.isnan(a):
        return math.isnan(b) != math.isnan(a)
    if contract is Contract.EXACT:
        return b != a or math.copysign(1.0, b) != math.copysign(1.0, a)
    return b != a


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_wrong_pass_is_refuted_with_a_replayable_counterexample(name):
    pass_, make = CORPUS[name]
    module = make()
    report = _report(name)
    assert report.obligations, "the seeded bug must change the module"
    refuted = [o for o in report.obligations if o.status == "refuted"]
    assert refuted, [str(o.verdict) for o in report.obligations]
    verdict = refuted[0].verdict
    assert isinstance(verdict, Refuted)
    ce = verdict.counterexample
    assert ce.model_constants, "the corpus models' bugs show with their own constants"
    # replay independently: the whole modules, on the parameters of the counterexample
    assert ce.function_inputs is not None
    inputs = [ce.function_inputs[p.name] for p in module.main.params]
    after = pass_.run(module).module
    position = module.main.result_names.index(refuted[0].output)
    got_before = run_reference(module, inputs)[position][ce.index]
    got_after = run_reference(after, inputs)[position][ce.index]
    assert _differs(got_before, got_after, pass_.contract)
    assert _same(got_before, ce.before) and _same(got_after, ce.after)


def _same(x, y) -> bool:
    x, y = float(x), float(y)
    return (math.isnan(x) and math.isnan(y)) or (x == y and math.copysign(1.0, x) == math.copysign(1.0, y))


def test_counterexample_table_is_aligned_and_names_the_inputs():
    (o,) = _report("bn-fold-without-eps").obligations
    table = o.verdict.counterexample.table()
    lines = table.splitlines()
    assert any(line.strip().startswith("%x") for line in lines)
    before = next(line for line in lines if line.strip().startswith("before"))
    after = next(line for line in lines if line.strip().startswith("after"))
    assert before.index("f32") == after.index("f32")  # aligned columns
    assert "replayed on the reference interpreter" in table


def test_signed_zero_bug_is_caught_by_bitwise_comparison():
    (o,) = _report("x-plus-zero-removed").obligations
    ce = o.verdict.counterexample
    assert float(ce.before) == 0.0 == float(ce.after)
    assert np.signbit(ce.before) != np.signbit(ce.after)


def test_real_identity_that_overflows_in_floats_is_refuted():
    """exp(x) / sum(exp(x)) equals the shifted softmax over the reals, but not for large x."""
    (o,) = _report("softmax-without-max-shift").obligations
    ce = o.verdict.counterexample
    assert math.isfinite(float(ce.before)) and not math.isfinite(float(ce.after))


def test_every_seeded_bug_in_the_corpus_is_caught():
    assert len(CORPUS) >= MIN_CORPUS
    missed = {name: [str(o.verdict) for o in _report(name).obligations] for name in sorted(CORPUS)
              if not any(o.status == "refuted" for o in _report(name).obligations)}
    caught = len(CORPUS) - len(missed)
    assert not missed, f"caught {caught}/{len(CORPUS)}; missed: {missed}"


@pytest.mark.parametrize("name", ["int8-saturation-dropped", "requantize-shift-inverted"])
def test_integer_only_bugs_are_checked_on_bit_vectors(name):
    """An INT8 path with no float in it is encoded at its real widths (wrap-around included)."""
    (o,) = _report(name).obligations
    assert o.encoder == "int" and o.status == "refuted"
    ce = o.verdict.counterexample
    assert isinstance(ce.before, int) and -128 <= ce.before <= 127 and -128 <= ce.after <= 127
