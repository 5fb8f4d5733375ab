"""One content identity (cuvil.ir.hashing): every component of a module that carries meaning
changes its hash, and nothing else decides whether a pass changed a module."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cuvil.errors import IRError
from cuvil.ir import Builder, DType
from cuvil.ir.hashing import constant_conflicts, module_hash, structural_hash
from cuvil.ir.module import Function, Module, content_hash
from cuvil.ir.region import Region
from cuvil.ir.types import DimConstraint, TensorType
from cuvil.ir.wellformed import check_module
from cuvil.passes import Pass, PassResult
from cuvil.passes.manager import PassManager


def _model(*, sub: bool = False, alpha: float = 0.1, weights: float = 1.0, leaky: bool = True) -> Module:
    b = Builder()
    x = b.param("x", DType.f32, ["N", 3])
    y = b.param("y", DType.f32, ["N", 3])
    w = b.const(np.full((3, 3), weights, np.float32))
    t, tb = TensorType(DType.f32, ("N", 3)), TensorType(DType.f32, ("N", 3))
    a0, a1 = Region.arg(0, t), Region.arg(1, tb)
    body = b.relu(b.sub(a0, a1) if sub else b.add(a0, a1))
    fused = b.fused(b.matmul(x, w), y, body=Region((a0, a1), body))
    act = b.leaky_relu(fused, alpha=alpha) if leaky else fused
    fn = b.function("main", [x, y], [act, b.exp(x)], result_names=["out", "aux"],
                    constraints=[DimConstraint("N", lo=1, hi=64)])
    return b.module(fn)


def _mutations(m: Module) -> dict[str, Module]:
    fn = m.main
    key = next(iter(m.constants))
    swapped = dict(m.constants)
    swapped[key] = np.full((3, 3), 2.0, np.float32)
    x, y = fn.params
    return {
        "region body": _model(sub=True),
        "attribute": _model(alpha=0.2),
        "constant bytes under the same key": Module(m.functions, swapped, m.metadata),
        "op removed": _model(leaky=False),
        "result names": m.replace(functions=[dataclasses.replace(fn, result_names=("aux", "out"))]),
        "result order": m.replace(functions=[dataclasses.replace(fn, results=fn.results[::-1])]),
        "parameter order": m.replace(functions=[dataclasses.replace(fn, params=(y, x))]),
        "dim constraint": m.replace(functions=[dataclasses.replace(
            fn, constraints=(DimConstraint("N", lo=1, hi=32),))]),
        "function name": m.replace(functions=[dataclasses.replace(fn, name="other")]),
        "metadata": Module(m.functions, m.constants, {**m.metadata, "memory-plan": "{}"}),
    }


def test_every_component_changes_the_module_hash() -> None:
    m = _model()
    base = module_hash(m)
    assert module_hash(_model()) == base, "the hash is a function of content"
    for what, other in _mutations(m).items():
        assert module_hash(other) != base, what


def test_zero_and_negative_zero_attributes_differ() -> None:
    assert module_hash(_model(alpha=0.0)) != module_hash(_model(alpha=-0.0))


def test_region_body_changes_the_value_hash() -> None:
    """A fused op is identified by its body's content, not by the body's op count and type."""
    f_add = _model().main.results[0].operands[0]
    f_sub = _model(sub=True).main.results[0].operands[0]
    assert f_add.op == f_sub.op == "fused"
    assert structural_hash(f_add) != structural_hash(f_sub)


def test_a_constant_key_holding_other_bytes_is_malformed() -> None:
    m = _model()
    key = next(iter(m.constants))
    bad = Module(m.functions, {key: np.full((3, 3), 2.0, np.float32)}, m.metadata)
    assert constant_conflicts(bad.constants) == [key]
    with pytest.raises(IRError, match="content hash"):
        check_module(bad)
    check_module(m)
    assert content_hash(m.constants[key]) == key


def test_module_constants_are_frozen() -> None:
    m = _model()
    arr = np.ones((3, 3), np.float32)
    other = Module(m.functions, {next(iter(m.constants)): arr}, m.metadata)
    stored = next(iter(other.constants.values()))
    assert not stored.flags.writeable
    arr[:] = 5.0  # the caller's array is not the module's
    assert float(stored[0, 0]) == 1.0


class _Liar(Pass):
    """Drops the leaky relu and claims nothing changed."""

    name = "liar"

    def run(self, module: Module) -> PassResult:
        fn = module.main
        out = fn.results[0].operands[0]
        return PassResult(module.replace(functions=[dataclasses.replace(fn, results=(out, fn.results[1]))]), False)


def test_pass_manager_decides_change_by_content_not_by_the_pass() -> None:
    m = _model()
    seen = []

    def gate(p, before, after):
        seen.append((before, after))
        return type("Accept", (), {"accept": True})()

    result = PassManager([_Liar()], gate=gate).run(m)
    assert result.records[0].changed
    assert seen, "the gate sees the application the pass called unchanged"
    assert result.module.main.results[0].op == "fused"


def test_function_hash_ignores_nothing_a_printer_shows() -> None:
    """Two modules that print differently hash differently (the text format is lossless)."""
    m = _model()
    texts = {str(other): module_hash(other) for other in _mutations(m).values()}
    texts[str(m)] = module_hash(m)
    hashes = list(texts.values())
    assert len(set(hashes)) == len(hashes)


def test_function_equality_is_not_the_identity_used() -> None:
    fn = _model().main
    renamed = Function(fn.name, fn.params, fn.results, ("a", "b"), fn.constraints)
    assert module_hash(Module((fn,))) != module_hash(Module((renamed,)))
