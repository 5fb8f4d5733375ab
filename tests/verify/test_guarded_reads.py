"""A read guarded by bounds checks, of a value itself read under bounds checks with the same fill (a
convolution's window over a zero pad): the encoder reads it under one guard, without the checks the
others imply, so the same element reached through one guard or two is one term. The sums' commuted
operands are ordered by their terms, so before this, folding a zero pad into a convolution with pads of
its own was proved at some shapes and not at others. Each claim is the prover's (the refuter's float
search is off where a test asks for a proof); the wrong folds beside them, whose guards must not merge,
are not proved and are refuted with a replayed counterexample."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from cuvil.ir.values import Value
from cuvil.passes import Contract
from cuvil.passes.base import Pass
from verify.obligations import Application, check_application

Body = Callable[[Builder, Value], Value]


def _module(shape: tuple[int, ...], body: Body) -> Module:
    b = Builder()
    x = b.param("x", DType.f32, list(shape))
    return b.module(b.function("main", [x], [b.exp(body(b, x))]))


def _check(shape: tuple[int, ...], before: Body, after: Body, search: str) -> Application:
    rewrite = type("Rewrite", (Pass,), {"name": "rewrite", "contract": Contract.EXACT})()
    return check_application(rewrite, _module(shape, before), _module(shape, after), search=search)


def _statuses(app: Application) -> list[str]:
    return [o.status for o in app.obligations]


def _weights(b: Builder, *shape: int) -> Value:
    return b.const((np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) - 3.5) / 8)


# (input shape, the pad's widths, the conv's own pads, the folded conv's pads, kernel, strides)
FOLDS = [
    ((1, 2, 3), (0, 0, 1, 0, 0, 0), (1, 0), (2, 0), (2,), (1,)),  # unknown before: the window's own begin pad
    ((1, 2, 5), (0, 0, 0, 0, 0, 2), (1, 0), (1, 2), (3,), (1,)),
    ((1, 2, 7), (0, 0, 1, 0, 0, 2), (2, 1), (3, 3), (3,), (2,)),
    ((1, 2, 4, 5), (0, 0, 1, 0, 0, 0, 0, 2), (1, 1, 0, 1), (2, 1, 0, 3), (3, 2), (1, 2)),
    ((1, 2, 5, 6), (0, 0, 0, 1, 0, 0, 1, 0), (1, 0, 1, 1), (1, 1, 2, 1), (2, 3), (2, 1)),
]


@pytest.mark.parametrize("case", range(len(FOLDS)))
def test_a_zero_pad_folded_into_a_padded_window_is_proved(case: int) -> None:
    shape, widths, own, folded, kernel, strides = FOLDS[case]
    w = (2, shape[1], *kernel)
    app = _check(shape, lambda b, x: b.conv(b.pad(x, pads=widths), _weights(b, *w), pads=own, strides=strides),
                 lambda b, x: b.conv(x, _weights(b, *w), pads=folded, strides=strides), search="prover")
    assert _statuses(app) == ["proved"]


WRONG = {
    # a pad of 1.0 read as the window's zeros: the two guards' fills differ and must stay two guards
    "a pad of ones folded": (
        lambda b, x: b.conv(b.pad(x, pads=(0, 0, 1, 0, 0, 0), value=1.0), _weights(b, 2, 2, 2), pads=(1, 0)),
        lambda b, x: b.conv(x, _weights(b, 2, 2, 2), pads=(2, 0))),
    # the widths at the wrong ends: the same output length, read one element off
    "begin and end swapped": (
        lambda b, x: b.conv(b.pad(x, pads=(0, 0, 1, 0, 0, 2)), _weights(b, 2, 2, 3), pads=(1, 0)),
        lambda b, x: b.conv(x, _weights(b, 2, 2, 3), pads=(3, 1))),
    # a crop (a negative width) under a padded window, both guards checked: the window's own lower bound
    # is not implied by the pad's, and without it the first window would read x[0] where it reads zero
    "a crop's window bound dropped": (
        lambda b, x: b.conv(b.pad(x, pads=(0, 0, -1, 0, 0, 2)), _weights(b, 2, 2, 3), pads=(2, 0)),
        lambda b, x: b.conv(x, _weights(b, 2, 2, 3), pads=(1, 2))),
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_a_wrong_fold_is_not_proved_and_is_refuted(name: str) -> None:
    before, after = WRONG[name]
    assert "proved" not in _statuses(_check((1, 2, 5), before, after, search="prover"))
    app = _check((1, 2, 5), before, after, search="both")
    assert _statuses(app) == ["refuted"]
    ce = app.obligations[0].verdict.counterexample  # type: ignore[attr-defined]
    assert ce.replayed
