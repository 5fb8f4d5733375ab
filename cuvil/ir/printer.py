"""The CIR text format, printing side.

The printed form is read back by :mod:`cuvil.ir.parser` into the identical module
(values are hash-consed, so re-parsing yields the very same objects)::

    module attributes {source = "onnx"} {
      const @k1a2b... : f32[3] = [1.0, 2.0, 3.5]
      const @k9f8e... : f32[512, 784] = base64"..."
      func @main(%x: f32[N, 784]) -> (%logits: f32[N, 10]) where 1 <= N <= 64, N % 8 == 0 {
        %0 = matmul(%x, @k9f8e...) {transpose_b = true} : f32[N, 512]
        %1 = relu(%0) : f32[N, 512]
        return %1
      }
    }

Floats are printed exactly (shortest text that reads back to the same bits, else the
float64 repr); constants larger than :data:`LITERAL_MAX_ELEMENTS` elements, or holding
NaNs with a payload, are printed as base64 of their little-endian bytes.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np

from cuvil.errors import IRError, UnsupportedOpError
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Function, Module
from cuvil.ir.opdef import REQUIRED, get_op
from cuvil.ir.region import Region
from cuvil.ir.symbolic import Dim, Sym
from cuvil.ir.types import TensorType
from cuvil.ir.values import Value, attr_key, normalize_attr, walk

LITERAL_MAX_ELEMENTS = 16
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# words an attribute value can be spelled as; a symbolic dim using one is parenthesized
RESERVED_WORDS = frozenset({"true", "false", "none", "inf", "nan"} | {d.value for d in DType})


# --------------------------------------------------------------------------------------
# names, dims and types


def format_name(name: str) -> str:
    """An identifier as is; anything else JSON-quoted (``input.1`` -> ``"input.1"``)."""
    return name if IDENT.fullmatch(name) else json.dumps(name)


def format_dim(d: Dim) -> str:
    """A dim in a form ``parse_dim`` and the CIR parser read back unambiguously.

    ``Sym.__str__`` prints ``3*((N)//2)`` as ``3*(N)//2``, which reads back as ``(3*N)//2``;
    here floor-division and modulo atoms are parenthesized whenever they sit in a product."""
    if isinstance(d, int):
        return str(d)
    if not d.terms:
        return "0"
    parts: list[str] = []
    for k, (mono, coef) in enumerate(reversed(d.terms)):  # highest degree first
        first = k == 0
        if not mono:
            body, sign = str(abs(coef)), "-" if coef < 0 else "+"
        else:
            alone = len(mono) == 1 and abs(coef) == 1 and not (first and coef < 0)
            factors = [_format_factor(f, alone) for f in mono]
            body = "*".join(factors if abs(coef) == 1 else [str(abs(coef)), *factors])
            sign = "-" if coef < 0 else "+"
        if first:
            parts.append(("-" if sign == "-" else "") + body)
        else:
            parts.append(f" {sign} {body}")
    return "".join(parts)


def _format_factor(f: Any, alone: bool) -> str:
    if isinstance(f, str):
        return f
    if f.kind in ("max", "min"):
        return f"{f.kind}({', '.join(format_dim(a) for a in f.args)})"
    op = "//" if f.kind == "floordiv" else "%"
    text = f"{_paren_dim(f.args[0])} {op} {_paren_dim(f.args[1])}"
    return text if alone else f"({text})"


def _paren_dim(d: Dim) -> str:
    """An operand of ``//`` or ``%``: bare when it is a number, a symbol or a max/min call."""
    text = format_dim(d)
    if isinstance(d, int):
        return text if d >= 0 else f"({text})"
    if not d.terms:
        return "0"
    (mono, coef), *rest = d.terms
    single = not rest and coef == 1 and len(mono) == 1
    if single and (isinstance(mono[0], str) or mono[0].kind in ("max", "min")):
        return text
    return f"({text})"


def format_type(t: TensorType) -> str:
    return f"{t.dtype.value}[{', '.join(format_dim(d) for d in t.shape)}]"


# --------------------------------------------------------------------------------------
# attributes


def format_float(x: float) -> str:
    """Exact, and always recognizably a float: ``1.0``, ``-0.0``, ``1e-05``, ``inf``, ``nan``."""
    if math.isnan(x):
        return "nan"
    return repr(float(x))


def format_attr(v: Any, indent: str = "") -> str:
    """One attribute value; ``indent`` is the indentation of the line it sits on (regions span lines)."""
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return format_float(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, DType):
        return v.value
    if isinstance(v, Sym):
        text = format_dim(v)
        return f"({text})" if v.symbols() & RESERVED_WORDS else text
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(format_attr(x, indent) for x in v) + "]"
    if isinstance(v, Region):
        return format_region(v, indent)
    raise IRError(f"attribute value {v!r} of type {type(v).__name__} has no text form",
                  hint="attributes are ints, floats, bools, strings, dtypes, dims, none, regions, or lists of those")


def printed_attrs(v: Value) -> list[tuple[str, Any]]:
    """The attributes worth printing: those that differ from the op's default.

    Defaults are left out only when the value holds every attribute its definition lists
    (what the Builder produces); the parser fills them back in."""
    try:
        opdef = get_op(v.op)
    except UnsupportedOpError:
        return list(v.attrs)
    specs = {a.name: a for a in opdef.attrs}
    if set(specs) != {k for k, _ in v.attrs}:
        return list(v.attrs)
    out = []
    for k, val in v.attrs:
        default = specs[k].default
        if default is not REQUIRED and attr_key(normalize_attr(default)) == attr_key(val):
            continue
        out.append((k, val))
    return out


# --------------------------------------------------------------------------------------
# constants


def _float_text(x: np.generic) -> str:
    """The shortest text that reads back (via float64) to exactly ``x``'s bits."""
    f = float(x)
    if math.isnan(f):
        return "nan"
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    short = str(x)
    if re.fullmatch(r"-?\d+(\.\d*)?(e[+-]?\d+)?", short) and ("." in short or "e" in short):
        back = np.array(float(short)).astype(x.dtype)
        if back.tobytes() == np.array(x).tobytes():
            return short
    return repr(f)


def _literal_ok(arr: np.ndarray, dtype: DType) -> bool:
    """Small arrays print as literals, unless a NaN carries a payload or sign a literal would lose."""
    if arr.size > LITERAL_MAX_ELEMENTS:
        return False
    if dtype.is_float:
        canonical = np.array(np.nan, dtype=arr.dtype).tobytes()
        for x in arr.reshape(-1):
            if np.isnan(x) and np.array(x).tobytes() != canonical:
                return False
    return True


def _format_elements(arr: np.ndarray, dtype: DType) -> str:
    if arr.ndim == 0:
        x = cast(np.generic, arr[()])  # numpy's stubs type arr[()] as an array; on a 0-d array it is a scalar
        if dtype is DType.bool:
            return "true" if bool(x) else "false"
        if dtype.is_float:
            return _float_text(x)
        return str(int(x))
    return "[" + ", ".join(_format_elements(arr[i], dtype) for i in range(arr.shape[0])) + "]"


def format_constant_data(arr: np.ndarray) -> str:
    dtype = DType.from_numpy(arr.dtype)
    if _literal_ok(arr, dtype):
        return _format_elements(arr, dtype)
    data = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
    return 'base64"' + base64.b64encode(data).decode("ascii") + '"'


# --------------------------------------------------------------------------------------
# functions and modules


def value_names(fn: Function | Region) -> dict[Value, str]:
    """``%name`` for params, ``%0, %1, ...`` for ops (skipping numbers a param already uses)."""
    names: dict[Value, str] = {p: "%" + format_name(p.name) for p in fn.params}
    taken = {p.name for p in fn.params}
    counter = 0
    for v in _body(fn):
        if v in names:
            continue
        if v.is_const:
            names[v] = "@" + format_name(v.const_hash)
        elif v.is_param:
            names[v] = "%" + format_name(v.name)  # a stray param: printed so the parser can point at it
        else:
            while str(counter) in taken:
                counter += 1
            names[v] = f"%{counter}"
            counter += 1
    return names


def _body(fn: Function | Region) -> list[Value]:
    return fn.values() if isinstance(fn, Function) else list(walk(fn.results))


def _op_lines(fn: Function | Region, indent: str) -> list[str]:
    """``%3 = op(%a, @k) {attrs} : type`` for every op of a function or region body."""
    names = value_names(fn)
    lines = []
    for v in _body(fn):
        if v.is_param or v.is_const:
            continue
        operands = ", ".join(names[o] for o in v.operands)
        attrs = printed_attrs(v)
        attr_text = " {" + ", ".join(f"{format_name(k)} = {format_attr(a, indent)}" for k, a in attrs) + "}" \
            if attrs else ""
        lines.append(f"{indent}{names[v]} = {v.op}({operands}){attr_text} : {format_type(v.type)}")
    return lines


def format_region(region: Region, indent: str) -> str:
    """``region(%arg0: f32[4]) { ... yield %1 }``; the body is indented one step past ``indent``."""
    names = value_names(region)
    params = ", ".join(f"{names[p]}: {format_type(p.type)}" for p in region.params)
    lines = [f"region({params}) {{", *_op_lines(region, indent + "  "),
             f"{indent}  yield {', '.join(names[r] for r in region.results)}", f"{indent}}}"]
    return "\n".join(lines)


def print_function(fn: Function, indent: str = "  ") -> str:
    names = value_names(fn)
    params = ", ".join(f"{names[p]}: {format_type(p.type)}" for p in fn.params)
    results = ", ".join(f"%{format_name(n)}: {format_type(r.type)}"
                        for n, r in zip(fn.result_names, fn.results, strict=False))
    head = f"func @{format_name(fn.name)}({params}) -> ({results})"
    if fn.constraints:
        head += " where " + ", ".join(str(c) for c in fn.constraints)  # DimConstraint prints its .cir form
    lines = [indent + head + " {", *_op_lines(fn, indent + "  ")]
    lines.append(f"{indent}  return " + ", ".join(names[r] for r in fn.results))
    lines.append(indent + "}")
    return "\n".join(lines)


def _format_metadata(meta: Mapping[str, Any]) -> str:
    return ", ".join(f"{format_name(str(k))} = {json.dumps(str(v))}" for k, v in meta.items())


def print_module(module: Module, *, elide_above: int | None = None) -> str:
    """The module as .cir text; :func:`cuvil.ir.parser.parse_module` reads it back losslessly.
    ``elide_above=n`` prints constants of more than n elements as a summary, for reading only."""
    head = "module"
    if module.metadata:
        head += " attributes {" + _format_metadata(module.metadata) + "}"
    lines = [head + " {"]
    for key, arr in module.constants.items():
        t = TensorType(DType.from_numpy(arr.dtype), tuple(arr.shape))
        data = f"<{arr.size} elements elided>" if elide_above is not None and arr.size > elide_above \
            else format_constant_data(arr)
        lines.append(f"  const @{format_name(key)} : {format_type(t)} = {data}")
    for fn in module.functions:
        lines.append(print_function(fn))
    lines.append("}")
    return "\n".join(lines) + "\n"


def export_ir(module: Module, path: str | os.PathLike) -> Path:
    """Write ``module`` as .cir text (atomically: a reader never sees half a file)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(print_module(module), encoding="utf-8")
    os.replace(tmp, target)
    return target


__all__ = ["export_ir", "format_attr", "format_dim", "format_type", "print_function", "print_module"]
