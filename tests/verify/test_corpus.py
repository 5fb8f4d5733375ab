"""Before/after pairs in the text format, each tagged with its expected verdict and contract
(correct rewrites, and seeded bugs named after the miscompilations they model), run as one
suite through ``check_rewrite``."""

import dataclasses
from pathlib import Path

import pytest

from cuvil.ir.module import Module
from cuvil.ir.parser import parse_module
from verify import check_rewrite

CORPUS = Path(__file__).parent / "corpus"


def _tag(text: str, key: str) -> str:
    for line in text.splitlines():
        if line.startswith(f"# {key}:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"missing '# {key}:' tag")


def _pair(path: Path) -> tuple[Module, Module, str, str]:
    text = path.read_text()
    m = parse_module(text, str(path))
    before, after = (dataclasses.replace(m.function(n), name="main") for n in ("before", "after"))
    return Module((before,), m.constants), Module((after,), m.constants), _tag(text, "expect"), _tag(text, "contract")


def test_the_corpus_has_both_verdicts():
    expects = {_tag(p.read_text(), "expect") for p in CORPUS.glob("*.cir")}
    assert expects == {"proved", "refuted"}


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.cir")), ids=lambda p: p.stem)
def test_corpus_pair_gets_its_expected_verdict(path):
    before, after, expect, contract = _pair(path)
    report = check_rewrite(before, after, contract, name=path.stem)
    (o,) = report.obligations
    assert o.status == expect, str(o.verdict)
    if expect == "refuted":
        assert o.verdict.counterexample.replayed


@pytest.mark.parametrize("stem", ["int8-saturation-dropped", "requantize-shift-folded-overflow"])
def test_integer_bug_outside_the_random_range_is_refuted_by_a_bit_vector_model(stem):
    """Random integer inputs stay small; the wrap-around these rewrites miss needs large values,
    which the bit-vector model of the difference supplies."""
    before, after, _, contract = _pair(CORPUS / f"{stem}.cir")
    (o,) = check_rewrite(before, after, contract, name=stem).obligations
    assert o.encoder == "int" and o.status == "refuted"
    ce = o.verdict.counterexample
    assert "z3 model" in ce.found_by and ce.replayed
    (x,) = (t.value for t in ce.inputs)
    assert abs(int(x[ce.index])) > 127  # elementwise: the differing output's own input
