"""Proofs of every canonicalization rule, each applied alone to a small model where it fires, at
several shapes whose dims are distinct and >= 2 (an axis mix-up cannot hide behind a size-1 dim).

``cuvil verify --rules`` runs these; a rule without an instance here is reported, never skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from cuvil.ir.values import Value
from cuvil.passes import canonicalize
from cuvil.passes.base import Pass
from cuvil.passes.rewrite import RewritePass, Rule, RuleSet
from verify.batch import Pending, check_all
from verify.obligations import DEFAULT_TIMEOUT, Application

SHAPES: tuple[tuple[int, ...], ...] = ((3, 5), (5, 2, 3), (2, 3, 4))

Build = Callable[[Builder, Value], Value]


def _rot(rank: int) -> list[int]:
    return [*range(1, rank), 0]


def _rev(rank: int) -> list[int]:
    return list(range(rank))[::-1]


# rule name -> [(instance label, input dtype, model body)]; every body wraps the rewritten value in a
# further op, so the obligation is about a use of it, not a bare parameter
INSTANCES: dict[str, list[tuple[str, DType, Build]]] = {
    "mul-by-one": [("x*1", DType.f32, lambda b, x: b.exp(b.mul(x, b.scalar(1.0, DType.f32))))],
    "mul-by-one-lhs": [("1*x", DType.f32, lambda b, x: b.exp(b.mul(b.scalar(1.0, DType.f32), x)))],
    "div-by-one": [("x/ones", DType.f32,
                    lambda b, x: b.exp(b.div(x, b.const(np.ones(x.type.shape[-1:], np.float32)))))],
    "sub-zero": [("x-0.0", DType.f32, lambda b, x: b.tanh(b.sub(x, b.scalar(0.0, DType.f32))))],
    "add-negative-zero": [("x+(-0.0)", DType.f32, lambda b, x: b.tanh(b.add(x, b.scalar(-0.0, DType.f32))))],
    "double-transpose": [
        ("reversed twice", DType.f32,
         lambda b, x: b.exp(b.transpose(b.transpose(x, perm=_rev(x.type.rank)), perm=_rev(x.type.rank)))),
        ("rotated twice", DType.f32,
         lambda b, x: b.exp(b.transpose(b.transpose(x, perm=_rot(x.type.rank)), perm=_rot(x.type.rank)))),
    ],
    "identity-transpose": [("perm=id", DType.f32,
                            lambda b, x: b.exp(b.transpose(x, perm=list(range(x.type.rank)))))],
    "reshape-chain": [("flatten then reverse", DType.f32,
                       lambda b, x: b.exp(b.reshape(b.reshape(x, shape=(int(np.prod([int(d) for d in x.type.shape])),)),
                                                    shape=tuple(reversed(x.type.shape)))))],
    "identity-reshape": [("own shape", DType.f32, lambda b, x: b.exp(b.reshape(x, shape=x.type.shape)))],
    "identity-cast": [("f32->f32", DType.f32, lambda b, x: b.exp(b.cast(x, to=DType.f32)))],
    "widening-cast-round-trip": [
        ("f16->f32->f16", DType.f16, lambda b, x: b.cast(b.cast(x, to=DType.f32), to=DType.f16)),
        ("i8->i32->i8", DType.i8, lambda b, x: b.cast(b.cast(x, to=DType.i32), to=DType.i8)),
    ],
    "double-negation": [("neg neg", DType.f32, lambda b, x: b.exp(b.neg(b.neg(x))))],
    "relu-idempotent": [("relu relu", DType.f32, lambda b, x: b.exp(b.relu(b.relu(x))))],
    "pad-into-conv": [
        ("1-D, padded both sides", DType.f32,
         lambda b, x: b.exp(b.conv(b.pad(_as_image(b, x, 1), pads=(0, 0, 1, 0, 0, 2)), _taps(b, 2, 1, 3),
                                   pads=(1, 0)))),
        ("2-D, strided", DType.f32,
         lambda b, x: b.exp(b.conv(b.pad(_as_image(b, x, 2), pads=(0, 0, 1, 2, 0, 0, 0, 1)), _taps(b, 2, 1, 2, 2),
                                   strides=(2, 1)))),
    ],
}


def _as_image(b: Builder, x: Value, spatial: int) -> Value:
    """``x`` as one single-channel image with ``spatial`` axes (the last ones holding the rest of ``x``)."""
    dims = [int(d) for d in x.type.shape]
    sp = [int(np.prod(dims))] if spatial == 1 else [dims[0], int(np.prod(dims[1:]))]
    return b.reshape(x, shape=(1, 1, *sp))


def _taps(b: Builder, *shape: int) -> Value:
    """Convolution weights of distinct values (a mix-up of taps cannot hide behind equal ones)."""
    return b.const((np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) - 2.5) / 4)


@dataclass(frozen=True)
class RuleCase:
    """One rule at one shape: the rule applied alone to the instance model."""

    rule: str
    instance: str
    shape: tuple[int, ...]
    pass_: Pass
    before: Module
    after: Module | None
    problem: str = ""

    @property
    def label(self) -> str:
        return f"{self.rule} [{self.instance}] at {'x'.join(map(str, self.shape))}"


@dataclass
class RuleOutcome:
    case: RuleCase
    application: Application | None

    @property
    def status(self) -> str:
        """``proved`` only when the rule fired and every obligation was proved."""
        if self.application is None:
            return "unknown"
        statuses = {o.status for o in self.application.obligations}
        if "refuted" in statuses:
            return "refuted"
        if "unknown" in statuses or (not self.application.obligations and not self.application.identical_outputs):
            return "unknown"
        return "proved"

    @property
    def reason(self) -> str:
        if self.application is None:
            return self.case.problem
        reasons = [f"{o.output}: {o.verdict}" for o in self.application.obligations if o.status != "proved"]
        return "; ".join(reasons)


def rule_table() -> RuleSet:
    """The rules proved here: canonicalization's rule table."""
    return canonicalize.RULES


def _single_rule_pass(rule: Rule) -> Pass:
    cls = type(f"Only_{rule.name.replace('-', '_')}", (RewritePass,),
               {"name": f"canonicalize:{rule.name}", "contract": canonicalize.Canonicalize.contract,
                "rules": lambda self: RuleSet((rule,))})
    return cls()


def _model(build: Build, dtype: DType, shape: tuple[int, ...]) -> Module:
    b = Builder()
    x = b.param("x", dtype, list(shape))
    return b.module(b.function("main", [x], [build(b, x)]))


def cases(shapes: Sequence[tuple[int, ...]] = SHAPES) -> list[RuleCase]:
    """Every rule of the table at every shape (a rule without an instance gives one failing case)."""
    out: list[RuleCase] = []
    for rule in rule_table():
        pass_ = _single_rule_pass(rule)
        instances = INSTANCES.get(rule.name)
        if not instances:
            empty = Builder().module()
            out.append(RuleCase(rule.name, "-", (), pass_, empty, None,
                                "no instance model for this rule in verify/rules_check.py"))
            continue
        for label, dtype, build in instances:
            for shape in shapes:
                before = _model(build, dtype, shape)
                result = pass_.run(before)
                fired = any(n.startswith(f"{rule.name}:") for n in result.notes)
                problem = "" if fired and result.changed else "the rule did not fire on its instance model"
                out.append(RuleCase(rule.name, label, shape, pass_, before,
                                    result.module if fired and result.changed else None, problem))
    return out


def check_rules(all_cases: Sequence[RuleCase] | None = None, *, timeout: float = DEFAULT_TIMEOUT, seed: int = 0,
                jobs: int = 1, progress: Callable[[int, Application], None] | None = None,
                started: Callable[[], None] | None = None) -> list[RuleOutcome]:
    """Prove every case (default: :func:`cases`); a case whose rule did not fire is an outcome
    without an application."""
    all_cases = cases() if all_cases is None else all_cases
    runnable = [c for c in all_cases if c.after is not None]
    pending = [Pending(c.pass_, c.before, c.after) for c in runnable if c.after is not None]
    apps = check_all(pending, timeout=timeout, seed=seed, jobs=jobs, progress=progress, started=started)
    by_case = dict(zip((id(c) for c in runnable), apps, strict=True))
    return [RuleOutcome(c, by_case.get(id(c))) for c in all_cases]
