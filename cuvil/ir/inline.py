"""Composing compute rules: the rule of a value computed by a chain of ops is the
consumer's rule with each load of a producer replaced by the producer's rule at that
index. Fused ops get their meaning this way (never written a second time), and the
verifier and the LLVM lowering use it to see a whole cone as one expression."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from cuvil.ir import rules as R
from cuvil.ir.opdef import get_op
from cuvil.ir.values import Value


def subst_ix(ix: R.Ix, env: Mapping[str, R.Ix], load: Callable[[R.Load], R.Expr]) -> R.Ix:
    if ix.kind == "var":
        return env.get(ix.args[0], ix)
    if ix.kind == "lit":
        return ix
    if ix.kind == "dyn":
        return R.Ix.dyn(subst_expr(ix.args[0], env, load))
    return R.Ix(ix.kind, tuple(subst_ix(a, env, load) for a in ix.args))


def subst_expr(e: R.Expr, env: Mapping[str, R.Ix], load: Callable[[R.Load], R.Expr]) -> R.Expr:
    """Rename index variables by ``env`` and replace every load by ``load(load_with_renamed_index)``."""
    if isinstance(e, R.Load):
        return load(R.Load(e.dtype, e.operand, tuple(subst_ix(i, env, load) for i in e.index), e.oob))
    if isinstance(e, (R.Lit,)):
        return e
    if isinstance(e, R.IndexValue):
        return R.IndexValue(e.dtype, subst_ix(e.ix, env, load))
    if isinstance(e, R.Call):
        return R.Call(e.dtype, e.fn, tuple(subst_expr(a, env, load) for a in e.args), e.attrs)
    if isinstance(e, R.Reduce):
        # fresh names keep nested reductions of two inlined copies apart
        fresh = {name: R.Ix.var(f"{name}_{next(R._fresh)}") for name, _ in e.axes}
        inner = {**env, **fresh}
        axes = tuple((fresh[name].args[0], ext) for name, ext in e.axes)
        return R.Reduce(e.dtype, e.kind, axes, subst_expr(e.body, inner, load))
    raise TypeError(f"unknown rule node {type(e).__name__}")


def value_rule(v: Value, index: tuple[R.Ix, ...], leaf: Callable[[Value, tuple[R.Ix, ...], R.Load], R.Expr],
               inline: Callable[[Value], bool]) -> R.Expr:
    """The rule of ``v`` at ``index``, inlining producers for which ``inline(v)`` holds; loads of
    other values become ``leaf(value, index, load)``."""
    rule = get_op(v.op).make_rule([o.type for o in v.operands], v.attr_dict, v.type)
    env = {f"i{k}": ix for k, ix in enumerate(index)}

    def load(ld: R.Load) -> R.Expr:
        producer = v.operands[ld.operand]
        if inline(producer):
            inner = value_rule(producer, ld.index, leaf, inline)
            if ld.oob is None:
                return inner
            inb = _in_bounds(ld.index, producer.type.shape)
            return R.select(inb, inner, R.lit(ld.oob, inner.dtype))
        return leaf(producer, ld.index, ld)

    return subst_expr(rule, env, load)


def _in_bounds(index: tuple[R.Ix, ...], shape: tuple) -> R.Expr:
    cond: R.Expr | None = None
    for ix, d in zip(index, shape, strict=True):
        iv = R.IndexValue(R.DType.i64, ix)
        c = R.call("and", R.call("ge", iv, 0), R.call("lt", iv, R.IndexValue(R.DType.i64, R.as_ix(d))))
        cond = c if cond is None else R.call("and", cond, c)
    return cond if cond is not None else R.lit(True, R.DType.bool)
