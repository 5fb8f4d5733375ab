"""A pass that simplifies every block of a network the same way, where a block's pairs can only be proved once
the block below is in the cut: TimeSformer's divided attention runs each block's tokens through a reshape round
trip (an identity chain canonicalize removes) and a reshape of a reshape (which it merges). The sweep pairs the
first block, then goes over the after-values again while the cut grows: a value whose operands joined the cut
is tried again, and an identity chain once the value it returns to did. Before, one pass over the values
paired the first block only, and the output was left unknown (TimeSformer at O3: 1 of 6 obligations)."""

from __future__ import annotations

import numpy as np

from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from cuvil.ir.values import Value
from cuvil.passes.base import PASS_REGISTRY
from verify.obligations import check_application

BLOCKS = 3
WEIGHTS = [np.random.default_rng(60 + k).standard_normal((32, 32)).astype(np.float32) / 6 for k in range(2 * BLOCKS)]
BIAS = np.linspace(-0.5, 0.5, 32, dtype=np.float32)


def _block(b: Builder, x: Value, k: int, changed: int | None) -> Value:
    """``x`` [1, 8, 32]: its tokens through a reshape of a reshape, a layer, and a round trip back; block
    ``changed`` adds 1 where its layer's value is below -1e4, which no random input reaches."""
    tokens = b.reshape(b.reshape(x, shape=(4, 2, 32)), shape=(8, 32))
    y = b.add(b.matmul(tokens, b.const(WEIGHTS[2 * k])), b.const(BIAS))
    if k == changed:
        y = b.add(y, b.where(b.less(y, b.scalar(-1e4, DType.f32)), b.scalar(1.0, DType.f32),
                             b.scalar(0.0, DType.f32)))
    back = b.reshape(b.reshape(b.reshape(y, shape=(4, 2, 32)), shape=(1, 2, 2, 2, 32)), shape=(8, 32))
    out = b.tanh(b.matmul(back, b.const(WEIGHTS[2 * k + 1])))
    return b.add(x, b.reshape(out, shape=(1, 8, 32)))


def _network(changed: int | None = None) -> Module:
    b = Builder()
    x = b.param("x", DType.f32, [1, 8, 32])
    h = x
    for k in range(BLOCKS):
        h = _block(b, h, k, changed)
    return b.module(b.function("main", [x], [b.tanh(h)]))


def test_every_block_is_paired_as_the_cut_grows() -> None:
    before = _network()
    canonicalize = PASS_REGISTRY["canonicalize"]()
    after = canonicalize.run(before).module
    assert sum(v.op == "reshape" for v in after.main.values()) < sum(v.op == "reshape" for v in before.main.values())
    app = check_application(canonicalize, before, after, timeout=5.0)
    assert [o.status for o in app.obligations] == ["proved"]


def test_a_block_changed_where_random_inputs_do_not_reach_is_not_proved() -> None:
    """Prover-only: the after side's last block differs where its layer's value is below -1e4; the blocks below
    are paired as before, and the output must not be proved."""
    canonicalize = PASS_REGISTRY["canonicalize"]()
    changed = canonicalize.run(_network(changed=BLOCKS - 1)).module
    app = check_application(canonicalize, _network(), changed, timeout=5.0)
    assert app.lemmas, "no cut-point lemma was proved"
    assert [o.status for o in app.obligations] != ["proved"]
