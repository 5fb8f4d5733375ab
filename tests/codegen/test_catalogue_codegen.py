"""Every op of the catalogue, lowered from its compute rule, agrees with the interpreter.

The examples of a batch of ops (ops of one family, about 40 examples) are compiled as one function
(one LLVM module, one library), run natively, and compared with the interpreter: floats
within the dtype's tolerance (f32 1e-5 relative), integers and bools exactly, NaN at the
same positions. A failing batch is retried op by op, so the message names the ops.
"""

import pytest
from codegen_catalogue import batches, catalogue_results, run_batch

from cuvil.ir.opdef import all_ops

BATCHES = batches()


def test_batches_cover_the_whole_catalogue():
    assert sorted(op.name for ops in BATCHES.values() for op in ops) == sorted(op.name for op in all_ops())


@pytest.mark.parametrize("batch", sorted(BATCHES))
def test_ops_compile_and_match_interpreter(batch):
    results = run_batch(BATCHES[batch], f"catalogue_{batch}", opt_level=2)
    bad = {name: r.errors or ["no example could be compared"] for name, r in results.items() if not r.ok}
    assert not bad, "\n".join(f"{name}: {e}" for name, errs in bad.items() for e in errs)


# The full walk again at -O3 (vectorizer and unroller on) and -O0 (no optimization):
# about a minute each on two cores, so it runs with the slow suite.
@pytest.mark.slow
@pytest.mark.parametrize("opt_level", [0, 3])
def test_catalogue_at_other_opt_levels(opt_level):
    res = catalogue_results(opt_level)
    bad = {name: r.errors for name, r in res.items() if not r.ok}
    assert not bad, bad
