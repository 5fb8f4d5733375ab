"""Op definitions: the one place an op's signature, shape rule and meaning live.

``define`` registers an :class:`OpDef` in the catalogue. The interpreter, the
z3 encoder and the LLVM lowering all read ``OpDef.rule``; ``OpDef.numpy`` is an
optional fast path (a schedule of the rule) that tests compare with it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from cuvil.errors import OpDefinitionError, ShapeError
from cuvil.ir.dtypes import DType
from cuvil.ir.rules import Expr, RuleCtx
from cuvil.ir.symbolic import Dim, Sym, normalize_dim
from cuvil.ir.types import TensorType


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()

ATTR_KINDS = ("int", "float", "bool", "str", "dtype", "ints", "floats", "dims", "any")


@dataclass(frozen=True)
class AttrSpec:
    """One attribute: its name, kind (see ``ATTR_KINDS``) and default (``REQUIRED`` if none).
    A default of ``None`` makes the attribute optional."""

    name: str
    kind: str
    default: Any = REQUIRED

    def coerce(self, value: Any, op: str) -> Any:
        if value is None and self.default is None:
            return None
        try:
            return _COERCE[self.kind](value)
        except (TypeError, ValueError) as e:
            raise OpDefinitionError(
                f"attribute {self.name!r} of {op} must be {self.kind}, got {value!r}",
                location=op, hint=str(e)) from None


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"expected an integer, got {type(v).__name__}")
    return int(v)


def _float(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"expected a number, got {type(v).__name__}")
    return float(v)


def _bool(v: Any) -> bool:
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)) and int(v) in (0, 1):
        return bool(v)
    raise TypeError(f"expected a bool, got {v!r}")


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"expected a string, got {type(v).__name__}")
    return v


def _dtype(v: Any) -> DType:
    return v if isinstance(v, DType) else DType(v)


def _seq(item: Callable[[Any], Any]) -> Callable[[Any], tuple]:
    def conv(v: Any) -> tuple:
        if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
            raise TypeError(f"expected a list, got {type(v).__name__}")
        return tuple(item(x) for x in v)

    return conv


def _dim(v: Any) -> Dim:
    if isinstance(v, bool):
        raise TypeError("expected a dim, got bool")
    return normalize_dim(v)


_COERCE: dict[str, Callable[[Any], Any]] = {
    "int": _int, "float": _float, "bool": _bool, "str": _str, "dtype": _dtype,
    "ints": _seq(_int), "floats": _seq(_float), "dims": _seq(_dim), "any": lambda v: v,
}

ShapeRule = Callable[..., TensorType]
NumpyImpl = Callable[..., np.ndarray]
# small test cases for the catalogue walk: rng -> [(operand arrays, attrs), ...]
Examples = Callable[[np.random.Generator], list[tuple[list[np.ndarray], dict[str, Any]]]]

PrecisionPolicy = Literal["narrow", "keep-fp32", "as-declared"]
PRECISION_POLICIES: tuple[PrecisionPolicy, ...] = ("narrow", "keep-fp32", "as-declared")


@dataclass(frozen=True)
class OpDef:
    """Everything about one op. ``operands`` names its operands; a name starting with ``*``
    is variadic (one or more). ``shape(types, **attrs)`` returns the result type;
    ``rule(ctx)`` the output element; ``numpy(arrays, out_type, **attrs)`` a fast path."""

    name: str
    operands: tuple[str, ...]
    attrs: tuple[AttrSpec, ...]
    shape: ShapeRule
    rule: Callable[[RuleCtx], Expr]
    numpy: NumpyImpl | None = None
    family: str = "misc"
    doc: str = ""
    commutative: bool = False
    examples: Examples | None = None
    contraction: bool = False
    """A bilinear contraction of its first two operands (each output element a sum of products of
    their elements) that the tuned GEMM/conv kernels compute (``bf16_matmul``: the GEMM over bfloat16
    pairs): fused epilogues anchor on it and INT8 lowering requantizes it. ``conv_transpose`` and
    ``einsum`` contract too, but nothing treats them so."""
    commutative_float: bool = True
    """False: ``commutative`` holds for integer and bool operands only. A float ``min``/``max`` returns its
    second operand on a tie, so ``max(+0, -0)`` is ``-0`` and ``max(-0, +0)`` is ``+0`` (numpy's and the
    library's choice): swapping its operands changes the bits. See :meth:`commutes`."""
    epilogue_fusible: bool = False
    """An elementwise op that may join a contraction's fused epilogue: bias and residual adds, scales,
    activations, and the cast / round / clip of an integer product's requantization."""
    precision_policy: PrecisionPolicy = "narrow"
    """What reduced-precision lowering (FP16) may do with a float32 instance of the op. ``narrow``: run
    it in the narrow type. ``keep-fp32``: its result is sensitive to range (exponentials, powers
    overflow float16 early) or to accumulated rounding (reductions, normalizations), so the FP16 pass
    keeps it float32; an FP16 compile narrows it only where the overflow prober proves it safe.
    ``as-declared``: its result type is an attribute (``cast``) or its definition's (``bf16_matmul``: bfloat16
    operands, a float32 result), so no lowering changes it."""
    structured: bool = False
    """Control flow (``loop``): no element rule; its meaning is a region it runs, so its ``numpy``
    reading takes ``use_fast_path`` and runs the region's ops by their rules or their fast paths."""

    def commutes(self, dtype: DType) -> bool:
        """Whether swapping the two operands of this op on ``dtype`` operands keeps every bit of its result."""
        return self.commutative and (self.commutative_float or not dtype.is_float)

    @property
    def variadic(self) -> bool:
        return any(o.startswith("*") for o in self.operands)

    def operand_index(self, name: str, count: int) -> int:
        names = [o.lstrip("*") for o in self.operands]
        if name not in names:
            raise OpDefinitionError(f"{self.name} has no operand {name!r}", location=self.name,
                                    hint="operands: " + ", ".join(names))
        return names.index(name)

    def check_arity(self, count: int) -> None:
        fixed = len(self.operands) - (1 if self.variadic else 0)
        ok = count >= fixed + 1 if self.variadic else count == fixed
        if not ok:
            want = f"at least {fixed + 1}" if self.variadic else str(fixed)
            raise OpDefinitionError(f"{self.name} takes {want} operands, got {count}", location=self.name)

    def check_attrs(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Validate and complete attributes with their defaults."""
        known = {a.name: a for a in self.attrs}
        for k in given:
            if k not in known:
                raise OpDefinitionError(f"{self.name} has no attribute {k!r}", location=self.name,
                                        hint="attributes: " + (", ".join(known) or "none"))
        out: dict[str, Any] = {}
        for a in self.attrs:
            if a.name in given:
                out[a.name] = a.coerce(given[a.name], self.name)
            elif a.default is REQUIRED:
                raise OpDefinitionError(f"{self.name} requires attribute {a.name!r}", location=self.name)
            else:
                out[a.name] = a.default
        return out

    def infer(self, types: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
        self.check_arity(len(types))
        try:
            return self.shape(list(types), **attrs)
        except ShapeError as e:
            if e.location is None:
                e.location = self.name
            raise
        except (ValueError, TypeError, IndexError, ZeroDivisionError) as e:
            shapes = ", ".join(str(t) for t in types)
            raise ShapeError(f"{self.name} cannot take operands ({shapes}) with {dict(attrs)}: {e}",
                             location=self.name) from None

    def make_rule(self, types: Sequence[TensorType], attrs: Mapping[str, Any], out: TensorType) -> Expr:
        return self.rule(RuleCtx.make(types, attrs, out))


OPS: dict[str, OpDef] = {}


def define(name: str, operands: Sequence[str], *, shape: ShapeRule, rule: Callable[[RuleCtx], Expr],
           attrs: Sequence[AttrSpec] | Mapping[str, tuple[str, Any]] = (), numpy: NumpyImpl | None = None,
           family: str = "misc", doc: str = "", commutative: bool = False, examples: Examples | None = None,
           contraction: bool = False, epilogue_fusible: bool = False, commutative_float: bool = True,
           precision_policy: PrecisionPolicy = "narrow", structured: bool = False) -> OpDef:
    """Register an op. ``attrs`` may be ``{"axis": ("int", -1)}`` or a list of AttrSpec.
    ``examples`` gives small cases (distinct dims >= 2) the catalogue test checks the
    fast path against the rule on; every op needs some. The remaining keywords are the op's
    properties (see :class:`OpDef`) that passes and kernels query instead of listing op names."""
    if name in OPS:
        raise OpDefinitionError(f"op {name!r} is defined twice", location=name)
    specs = tuple(AttrSpec(k, kind, default) for k, (kind, default) in attrs.items()) \
        if isinstance(attrs, Mapping) else tuple(attrs)
    for s in specs:
        if s.kind not in ATTR_KINDS:
            raise OpDefinitionError(f"{name}: unknown attribute kind {s.kind!r}", location=name)
    if precision_policy not in PRECISION_POLICIES:
        raise OpDefinitionError(f"{name}: unknown precision policy {precision_policy!r}", location=name,
                                hint="one of " + ", ".join(PRECISION_POLICIES))
    op = OpDef(name, tuple(operands), specs, shape, rule, numpy, family, doc, commutative, examples,
               contraction=contraction, commutative_float=commutative_float,
               epilogue_fusible=epilogue_fusible, precision_policy=precision_policy,
               structured=structured)
    OPS[name] = op
    _NAMES.clear()
    return op


def get_op(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        from cuvil.errors import UnsupportedOpError

        raise UnsupportedOpError(f"CIR has no op {name!r}", location=name) from None


def all_ops() -> list[OpDef]:
    return sorted(OPS.values(), key=lambda o: (o.family, o.name))


_NAMES: dict[str, frozenset[str]] = {}  # query -> op names; emptied whenever an op is defined


def _names(query: str, where: Callable[[OpDef], bool]) -> frozenset[str]:
    found = _NAMES.get(query)
    if found is None:
        found = _NAMES[query] = frozenset(o.name for o in OPS.values() if where(o))
    return found


def contraction_ops() -> frozenset[str]:
    """Names of the ops with ``contraction`` set (passes ask per value, so the answer is cached)."""
    return _names("contraction", lambda o: o.contraction)


def epilogue_fusible_ops() -> frozenset[str]:
    """Names of the ops with ``epilogue_fusible`` set."""
    return _names("epilogue_fusible", lambda o: o.epilogue_fusible)


def ops_with_precision(*policies: PrecisionPolicy) -> frozenset[str]:
    """Names of the ops whose ``precision_policy`` is one of ``policies``."""
    return _names("precision:" + ",".join(sorted(policies)), lambda o: o.precision_policy in policies)


# --------------------------------------------------------------------------------------
# shape-rule helpers shared by many ops


def broadcast_shapes(*shapes: Sequence[Dim]) -> tuple[Dim, ...]:
    """numpy broadcasting over possibly symbolic dims."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for k in range(rank):
        dim: Dim = 1
        for s in shapes:
            j = k - (rank - len(s))
            if j < 0:
                continue
            d = s[j]
            if d == 1:
                continue
            if dim == 1:
                dim = d
            elif dim != d:
                if isinstance(dim, Sym) or isinstance(d, Sym):
                    dim = d if isinstance(dim, Sym) else dim  # symbolic meets static: the static one
                else:
                    raise ShapeError(f"shapes {[tuple(map(str, s)) for s in shapes]} do not broadcast "
                                     f"(dim {k}: {dim} vs {d})")
        out.append(dim)
    return tuple(out)


def norm_axis(axis: int, rank: int, op: str = "") -> int:
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"axis {axis} out of range for rank {rank}", location=op or None)
    return axis % rank if rank else 0
