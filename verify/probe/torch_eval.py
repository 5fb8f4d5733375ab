"""A differentiable reader of compute rules (torch autograd), for gradient-guided witness search.

Every value is a float64 tensor: integers are exact below 2**53, rounding ops (floor, ceil,
round, float->int casts) pass gradients straight through, and narrow float types compute
in float64 (the search looks for inputs whose real-valued result leaves the range; the
reduced-precision interpreter then confirms them). Matmul and convolution have schedules
using torch's kernels (tested against the rule reader); every other op is read from its rule.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from cuvil.ir.dtypes import DType
from cuvil.ir.module import Function
from cuvil.ir.numpy_prims import bitcast
from cuvil.ir.opdef import get_op
from cuvil.ir.rules import Call, Expr, IndexValue, Lit, Load, Reduce, reduction_identity
from cuvil.ir.rulewalk import IxVal, RuleInfo, RuleWalker
from cuvil.ir.values import Value, reachable


def _torch() -> Any:
    import torch

    return torch


def available() -> bool:
    try:
        _torch()
    except ImportError:
        return False
    return True


def _ste(x: Any, f: Callable[[Any], Any]) -> Any:
    """``f(x)`` forward, identity backward."""
    return x + (f(x) - x).detach()


class TorchWalker(RuleWalker[Any]):
    """Reads a rule with torch tensors; ``capture`` collects the values of chosen nodes."""

    def __init__(self, info: RuleInfo, operands: Sequence[Any], capture: Sequence[int] = (),
                 chunk: tuple[int, int, int] | None = None) -> None:
        super().__init__(info, chunk)
        self.torch = _torch()
        self.operands = operands
        self.capture = set(capture)
        self.captured: dict[int, list[Any]] = {}

    def lift(self, v: Any) -> Any:
        nd = v.dim()
        if nd == self.depth:
            return v
        return v.reshape(tuple(v.shape) + (1,) * (self.depth - nd))

    def _t(self, a: np.ndarray) -> Any:
        return self.torch.from_numpy(np.ascontiguousarray(a))

    def load(self, e: Load, idx: list[IxVal]) -> Any:
        arr = self.operands[e.operand]
        ix = [i.lo for i in idx]
        if not ix:
            return self.lift(arr)
        inb = np.ones((1,) * self.depth, dtype=bool)
        for k, i in enumerate(ix):
            inb = inb & (i >= 0) & (i < arr.shape[k])
        clipped = tuple(self._t(np.clip(i, 0, max(arr.shape[k] - 1, 0))) for k, i in enumerate(ix))
        vals = arr[clipped]
        if e.oob is not None and not inb.all():
            mask = self._t(np.broadcast_to(inb, tuple(vals.shape)).copy())
            vals = self.torch.where(mask, vals, self.torch.tensor(float(e.oob), dtype=vals.dtype))
        return self.lift(vals)

    def literal(self, e: Lit) -> Any:
        return self.lift(self.torch.tensor(float(np.array(e.value, dtype=e.dtype.np)), dtype=self.torch.float64))

    def index_value(self, e: IndexValue, ix: IxVal) -> Any:
        return self.lift(self._t(ix.lo.astype(np.float64)))

    def dyn_index(self, e: Expr) -> IxVal:
        v = self.expr(e).detach().numpy()
        return IxVal.exact(np.trunc(np.where(np.isfinite(v), v, 0)).astype(np.int64))

    def call(self, e: Call, args: list[Any]) -> Any:
        t = self.torch
        fn = e.fn
        dt = e.dtype
        a = args[0]
        if fn == "cast":
            to: DType = dict(e.attrs)["to"]
            src = e.args[0].dtype
            if to is DType.bool:
                return (a != 0).to(t.float64)
            if to.is_int and src.is_float:
                return _ste(a, lambda x: t.trunc(t.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)))
            return a
        if fn == "bitcast":  # bits have no gradient: the exact reinterpretation, detached
            return self._bitcast(a, e.args[0].dtype, dict(e.attrs)["to"])
        if fn in _SIMPLE:
            return _SIMPLE[fn](t, *args)
        if fn == "div":
            if dt.is_float:
                return a / args[1]
            b = args[1]
            safe = t.where(b == 0, t.ones_like(b), b)
            return t.where(b == 0, t.zeros_like(a + b), _ste(a / safe, t.trunc))
        if fn in ("floor", "ceil", "round_even"):
            f = {"floor": t.floor, "ceil": t.ceil, "round_even": t.round}[fn]
            return _ste(a, f)
        if fn in ("eq", "ne", "lt", "le", "gt", "ge"):
            f = {"eq": t.eq, "ne": t.ne, "lt": t.lt, "le": t.le, "gt": t.gt, "ge": t.ge}[fn]
            return f(a, args[1]).to(t.float64)
        if fn in ("and", "or", "xor"):
            f = {"and": t.logical_and, "or": t.logical_or, "xor": t.logical_xor}[fn]
            return f(a != 0, args[1] != 0).to(t.float64)
        if fn == "not":
            return (a == 0).to(t.float64)
        if fn == "isnan":
            return t.isnan(a).to(t.float64)
        if fn == "isinf":
            return t.isinf(a).to(t.float64)
        if fn == "select":
            return t.where(a != 0, args[1], args[2])
        if fn in ("bit_and", "bit_or", "bit_xor", "bit_not", "shl", "shr"):
            ints = [x.detach().to(t.int64) for x in args]
            f = {"bit_and": t.bitwise_and, "bit_or": t.bitwise_or, "bit_xor": t.bitwise_xor,
                 "bit_not": t.bitwise_not, "shl": t.bitwise_left_shift, "shr": t.bitwise_right_shift}[fn]
            return f(*ints).to(t.float64)
        raise NotImplementedError(f"no torch reading of primitive {fn!r}")

    def _bitcast(self, a: Any, src: DType, to: DType) -> Any:
        """``a``'s bits read as ``to`` (values held as float64: integers exact below 2**53)."""
        with np.errstate(all="ignore"):
            held = np.asarray(a.detach().numpy()).astype(src.np)
            return self._t(bitcast(held, to).astype(np.float64))

    def reduce(self, e: Reduce, body: Any, axes: tuple[int, ...], extents: list[int]) -> Any:
        t = self.torch
        shape = list(np.broadcast_shapes(tuple(body.shape), (1,) * self.depth))
        for ax, n in zip(axes, extents, strict=True):
            shape[ax] = n
        full = body.expand(*shape)
        if 0 in extents:
            ident = float(reduction_identity(e.kind, e.dtype))
            return t.full(tuple(shape[:axes[0]]), ident, dtype=t.float64)
        if e.kind == "sum":
            return full.sum(dim=axes)
        if e.kind == "prod":
            out = full
            for ax in sorted(axes, reverse=True):
                out = out.prod(dim=ax)
            return out
        return full.amax(dim=axes) if e.kind == "max" else full.amin(dim=axes)

    def reduce_dot(self, e: Reduce, x: Any, y: Any, axes: tuple[int, ...], extents: list[int]) -> Any:
        """A dot's real value: the sum of the products (in float64, like every sum here)."""
        shape = list(np.broadcast_shapes(tuple(x.shape), tuple(y.shape), (1,) * self.depth))
        for ax, n in zip(axes, extents, strict=True):
            shape[ax] = n
        if 0 in extents:
            return self.torch.zeros(tuple(shape[:axes[0]]), dtype=self.torch.float64)
        return (x * y).expand(*shape).sum(dim=axes)

    def observe(self, e: Expr, value: Any) -> None:
        k = self.info.index.get(id(e))
        if k is not None and k in self.capture:
            self.captured.setdefault(k, []).append(value)


_SIMPLE: dict[str, Callable[..., Any]] = {
    "add": lambda t, a, b: a + b, "sub": lambda t, a, b: a - b, "mul": lambda t, a, b: a * b,
    "min": lambda t, a, b: t.minimum(a, b), "max": lambda t, a, b: t.maximum(a, b),
    "pow": lambda t, a, b: t.pow(a, b), "fmod": lambda t, a, b: t.fmod(a, b),
    "mod": lambda t, a, b: t.remainder(a, b), "neg": lambda t, a: -a, "abs": lambda t, a: t.abs(a),
    "exp": lambda t, a: t.exp(a), "log": lambda t, a: t.log(a), "sqrt": lambda t, a: t.sqrt(a),
    "tanh": lambda t, a: t.tanh(a), "erf": lambda t, a: t.erf(a), "sin": lambda t, a: t.sin(a),
    "cos": lambda t, a: t.cos(a), "tan": lambda t, a: t.tan(a), "asin": lambda t, a: t.asin(a),
    "acos": lambda t, a: t.acos(a), "atan": lambda t, a: t.atan(a), "sinh": lambda t, a: t.sinh(a),
    "cosh": lambda t, a: t.cosh(a), "asinh": lambda t, a: t.asinh(a), "acosh": lambda t, a: t.acosh(a),
    "atanh": lambda t, a: t.atanh(a),
}


# --------------------------------------------------------------------------------------
# schedules of two heavy rules


def _matmul(args: list[Any], attrs: Mapping[str, Any]) -> Any:
    a, b = args
    if attrs["transpose_a"]:
        a = a.transpose(-1, -2)
    if attrs["transpose_b"]:
        b = b.transpose(-1, -2)
    return a @ b


def _conv(args: list[Any], attrs: Mapping[str, Any]) -> Any:
    """The conv rule's schedule: empty strides / dilations / pads mean 1s / 1s / 0s, as the
    op's shape rule and compute rule read them."""
    import torch.nn.functional as F

    x, w = args
    nsp = x.dim() - 2
    strides = tuple(attrs["strides"] or (1,) * nsp)
    dil = tuple(attrs["dilations"] or (1,) * nsp)
    pads = tuple(attrs["pads"] or (0,) * (2 * nsp))
    torch_pad: list[int] = []
    for j in reversed(range(nsp)):
        torch_pad += [pads[j], pads[nsp + j]]
    if any(torch_pad):
        x = F.pad(x, torch_pad)
    f = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}.get(nsp)
    if f is None:
        raise NotImplementedError
    return f(x, w, stride=strides, dilation=dil, groups=int(attrs.get("groups", 1)))


SCHEDULES: dict[str, Callable[[list[Any], Mapping[str, Any]], Any]] = {"matmul": _matmul, "conv": _conv}


def _exact_in_float64(v: Value, operands: list[Any]) -> bool:
    """Whether a schedule computes the rule's real-valued result: always for float operands (the
    search reads narrow floats in float64 anyway); for integer operands when every product and
    partial sum stays below 2**53, so float64 sums them exactly in any order."""
    if all(o.dtype.is_float for o in v.operands):
        return True
    if not all(o.dtype.is_int for o in v.operands) or len(operands) != 2:
        return False
    x, w = operands
    terms = math.prod(int(d) for d in w.shape[1:]) if v.op == "conv" else max(int(d) for d in x.shape[-2:])
    bound = float(x.detach().abs().max()) * float(w.detach().abs().max()) * max(terms, 1)
    return bound < 2.0 ** 53


def op_value(v: Value, info: RuleInfo, operands: list[Any], capture: Sequence[int] = (),
             use_schedules: bool = True) -> tuple[Any, dict[int, list[Any]]]:
    """One op on torch operands: its result and the captured node values."""
    inner = [k for k in capture if k != 0]
    if use_schedules and v.op in SCHEDULES and not inner and _exact_in_float64(v, operands):
        try:
            out = SCHEDULES[v.op](operands, get_op(v.op).check_attrs(dict(v.attrs)))  # the op's defaults
            return out, ({0: [out]} if 0 in capture else {})
        except NotImplementedError:
            pass
    w = TorchWalker(info, operands, capture)
    out = w.expr(info.rule)
    out = out.expand(*info.out_shape) if tuple(out.shape) != info.out_shape else out
    return out, w.captured


class TorchProgram:
    """Evaluates a function in torch up to a value, with constants prepared once."""

    def __init__(self, fn: Function, constant_value: Callable[[Value], np.ndarray], live: set[Value],
                 rule_info: Callable[[Value], RuleInfo]) -> None:
        self.torch = _torch()
        self.fn = fn
        self.values = fn.values()
        self.position = {v: k for k, v in enumerate(self.values)}
        self.constant_value = constant_value
        self.live = live
        self.rule_info = rule_info
        self.consts: dict[Value, Any] = {}

    def const(self, v: Value) -> Any:
        hit = self.consts.get(v)
        if hit is None:
            data = np.asarray(self.constant_value(v), dtype=np.float64)
            hit = self.consts[v] = self.torch.from_numpy(np.ascontiguousarray(data))
        return hit

    def cone(self, targets: Sequence[Value]) -> list[Value]:
        need = reachable(targets, lambda v: [o for o in v.operands if o in self.live])
        return sorted(need, key=self.position.__getitem__)

    def run(self, inputs: Mapping[str, Any], targets: Mapping[Value, Sequence[int]]) -> dict[Value, dict[int, Any]]:
        """For torch inputs by parameter name: each target's captured rule nodes (node 0: its result)."""
        env: dict[Value, Any] = {}
        out: dict[Value, dict[int, Any]] = {}
        for v in self.cone(list(targets)):
            if v.is_param:
                env[v] = inputs[v.name]
                continue
            operands = [env[o] if o in env else self.const(o) for o in v.operands]
            cap = tuple(targets.get(v, ()))
            value, captured = op_value(v, self.rule_info(v), operands, cap)
            env[v] = value
            if v in targets:
                got = {k: vals for k, vals in captured.items()}
                if 0 in cap:
                    got[0] = [value]
                out[v] = got
        return out
