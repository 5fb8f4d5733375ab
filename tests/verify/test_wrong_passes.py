"""Seeded miscompilations: each wrong pass in the corpus is refuted, and its counterexample
replays on the reference interpreter when the before and after modules are run on the
counterexample's inputs."""

import math

import numpy as np
import pytest
from wrong_passes import CORPUS

from cuvil.interp import run_reference
from cuvil.passes.base import Contract
from verify import Refuted, check_pass


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
    report = check_pass(pass_, module)
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
    pass_, make = CORPUS["bn-fold-without-eps"]
    (o,) = check_pass(pass_, make()).obligations
    table = o.verdict.counterexample.table()
    lines = table.splitlines()
    assert any(line.strip().startswith("%x") for line in lines)
    before = next(line for line in lines if line.strip().startswith("before"))
    after = next(line for line in lines if line.strip().startswith("after"))
    assert before.index("f32") == after.index("f32")  # aligned columns
    assert "replayed on the reference interpreter" in table


def test_signed_zero_bug_is_caught_by_bitwise_comparison():
    pass_, make = CORPUS["x-plus-zero-removed"]
    (o,) = check_pass(pass_, make()).obligations
    ce = o.verdict.counterexample
    assert float(ce.before) == 0.0 == float(ce.after)
    assert np.signbit(ce.before) != np.signbit(ce.after)


def test_real_identity_that_overflows_in_floats_is_refuted():
    """exp(x) / sum(exp(x)) equals the shifted softmax over the reals, but not for large x."""
    pass_, make = CORPUS["softmax-without-max-shift"]
    (o,) = check_pass(pass_, make()).obligations
    ce = o.verdict.counterexample
    assert math.isfinite(float(ce.before)) and not math.isfinite(float(ce.after))
