"""Rewrites as data: a pattern over CIR values plus a replacement, composable into rule sets.

A :class:`Pat` matches a value by op name, operand patterns, attribute values and an
optional predicate, capturing named sub-values. A :class:`Rule` pairs a pattern with a
replacement that builds new values through a Builder (it may decline by returning None).
Rule sets compose with ``+``; :func:`rewrite_function` applies one bottom-up to a fixpoint.
A rewrite that reads better as code than as a pattern: ``cuvil.passes.ValueRewrite``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cuvil.ir.builder import Builder
from cuvil.ir.module import Function, Module
from cuvil.ir.values import Value, attr_key
from cuvil.passes.base import Pass, PassResult


@dataclass(frozen=True)
class Pat:
    """Match a value. ``op=None`` matches anything; ``operands=None`` any operand list."""

    op: str | None = None
    operands: tuple[Pat, ...] | None = None
    attrs: Mapping[str, Any] = field(default_factory=dict)
    capture: str | None = None
    where: Callable[[Value], bool] | None = None

    def __str__(self) -> str:
        if self.op is None:
            return f"${self.capture or '_'}"
        ops = ", ".join(str(o) for o in self.operands or ())
        return f"{self.op}({ops})" + (f" as ${self.capture}" if self.capture else "")


def op(name: str, *operands: Pat, capture: str | None = None, where: Callable[[Value], bool] | None = None,
       **attrs: Any) -> Pat:
    """Match op ``name`` with exactly these operand patterns; ``attrs`` values are compared, or
    called with the attribute when callable."""
    return Pat(name, tuple(operands), attrs, capture, where)


def any_(capture: str | None = None, where: Callable[[Value], bool] | None = None) -> Pat:
    """Match any value (a wildcard operand), capturing it under ``capture``."""
    return Pat(None, None, {}, capture, where)


def const(capture: str | None = None, where: Callable[[Value], bool] | None = None) -> Pat:
    """Match a constant; the replacement reads its data with ``b.data(m[capture])``."""
    return Pat("const", None, {}, capture, where)


@dataclass
class Match:
    """The root value, captured sub-values, and the context the rule may consult."""

    root: Value
    captures: dict[str, Value]
    ctx: RewriteContext

    def __getitem__(self, name: str) -> Value:
        return self.captures[name]


def match(p: Pat, v: Value, captures: dict[str, Value]) -> bool:
    if p.op is not None and v.op != p.op:
        return False
    if p.operands is not None and p.op is not None:
        if len(p.operands) != len(v.operands):
            return False
        for sp, sv in zip(p.operands, v.operands, strict=True):
            if not match(sp, sv, captures):
                return False
    for k, want in p.attrs.items():
        got = v.attr(k)
        if callable(want):
            if not want(got):
                return False
        elif attr_key(got) != attr_key(want):
            return False
    if p.where is not None and not p.where(v):
        return False
    if p.capture is not None:
        prev = captures.get(p.capture)
        if prev is not None and prev is not v:
            return False  # the same name must bind the same value
        captures[p.capture] = v
    return True


Replacement = Callable[[Match, Builder], Value | None]


@dataclass(frozen=True)
class Rule:
    """``name``: a kebab-case identifier used in logs, certificates and rule proofs."""

    name: str
    pattern: Pat
    replace: Replacement
    doc: str = ""

    def __add__(self, other: Rule | RuleSet) -> RuleSet:
        return RuleSet((self,)) + other


@dataclass(frozen=True)
class RuleSet:
    rules: tuple[Rule, ...]

    def __add__(self, other: Rule | RuleSet) -> RuleSet:
        extra = (other,) if isinstance(other, Rule) else other.rules
        return RuleSet(self.rules + extra)

    def __iter__(self):
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)


@dataclass
class RewriteContext:
    """Facts about the function being rewritten: use counts (of the input function)
    and the module's constant data."""

    builder: Builder
    use_counts: Counter[Value]
    fired: Counter[str] = field(default_factory=Counter)

    def uses(self, v: Value) -> int:
        return self.use_counts.get(v, 0)

    def data(self, v: Value) -> Any:
        """A constant's data (read-only numpy array), as ``Builder.data``; raises ``IRError`` otherwise."""
        return self.builder.data(v)


def use_counts(fn: Function) -> Counter[Value]:
    counts: Counter[Value] = Counter()
    for v in fn.values():
        for o in v.operands:
            counts[o] += 1
    for r in fn.results:
        counts[r] += 1
    return counts


def rebuild(v: Value, operands: tuple[Value, ...], b: Builder) -> Value:
    """``v`` with new operands, re-checked against its op definition."""
    if operands == v.operands:
        return v
    return b.op(v.op, *operands, **v.attr_dict)


def rewrite_function(fn: Function, rules: RuleSet | Rule, b: Builder, *, max_sweeps: int = 8,
                     fired: Counter[str] | None = None) -> Function:
    """Apply ``rules`` bottom-up until nothing fires (or ``max_sweeps`` sweeps)."""
    rs = RuleSet((rules,)) if isinstance(rules, Rule) else rules
    fired = fired if fired is not None else Counter()
    for _ in range(max_sweeps):
        ctx = RewriteContext(b, use_counts(fn), fired)
        before = sum(fired.values())
        fn = _sweep(fn, rs, ctx)
        if sum(fired.values()) == before:
            break
    return fn


def _sweep(fn: Function, rules: RuleSet, ctx: RewriteContext) -> Function:
    mapping: dict[Value, Value] = {}
    for v in fn.values():
        if v.is_param or v.is_const:
            mapping[v] = v
            continue
        nv = rebuild(v, tuple(mapping[o] for o in v.operands), ctx.builder)
        out = _apply_once(nv, rules, ctx)
        if out is not v:  # the new value takes over v's users, so single-use checks downstream still hold
            ctx.use_counts[out] += ctx.use_counts[v]
        mapping[v] = out
    return Function(fn.name, fn.params, tuple(mapping[r] for r in fn.results), fn.result_names, fn.constraints)


def _apply_once(v: Value, rules: RuleSet, ctx: RewriteContext) -> Value:
    for rule in rules:
        caps: dict[str, Value] = {}
        if not match(rule.pattern, v, caps):
            continue
        out = rule.replace(Match(v, caps, ctx), ctx.builder)
        if out is None or out is v:
            continue
        if out.type != v.type:
            raise AssertionError(f"rule {rule.name} changed the type {v.type} -> {out.type}")
        ctx.fired[rule.name] += 1
        return out
    return v


@dataclass(frozen=True)
class RewritePass(Pass):
    """A pass that is a rule set applied to every function; its notes count the rules that fired."""

    def rules(self) -> RuleSet:
        raise NotImplementedError

    def run(self, module: Module) -> PassResult:
        b = Builder(module.constants)
        fired: Counter[str] = Counter()
        rules = self.rules()
        fns = tuple(rewrite_function(fn, rules, b, fired=fired) for fn in module.functions)
        if fns == module.functions:
            return PassResult(module, False)
        notes = tuple(f"{rule}: {n}" for rule, n in sorted(fired.items()))
        return PassResult(module.replace(functions=fns, constants=b.constants), True, notes)
