"""Every op of the catalogue, lowered from its compute rule, agrees with the interpreter.

The examples of each op family are compiled as one function (one LLVM module, one
library), run natively, and compared with the interpreter: floats within the dtype's
tolerance (f32 1e-5 relative), integers and bools exactly, NaN at the same positions.
"""

import pytest
from codegen_catalogue import catalogue_results

from cuvil.ir.opdef import all_ops

OPS = all_ops()


@pytest.fixture(scope="module")
def results():
    return catalogue_results(2)


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
def test_op_compiles_and_matches_interpreter(op, results):
    r = results[op.name]
    assert not r.errors, "\n".join(r.errors)
    assert r.compared > 0, f"{op.name}: no example could be compared"


# The full walk again at -O3 (vectorizer and unroller on) and -O0 (no optimization):
# about a minute each on two cores, so it runs with the slow suite.
@pytest.mark.slow
@pytest.mark.parametrize("opt_level", [0, 3])
def test_catalogue_at_other_opt_levels(opt_level):
    res = catalogue_results(opt_level)
    bad = {name: r.errors for name, r in res.items() if not r.ok}
    assert not bad, bad
