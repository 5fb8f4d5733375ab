"""The expression language of fail-safe specs: arithmetic and logic over named reals and flags,
parsed from text once (a restricted Python syntax read with :mod:`ast`, never evaluated as code)
and read two ways from the same tree: as a z3 term for synthesis and proofs, and as a numpy
computation (vectorized over samples) for simulation.

Allowed: numbers, ``true``/``false`` (or ``True``/``False``), names, ``+ - * /``, ``**`` with a
small non-negative integer exponent, comparisons (chained too), ``and``/``or``/``not``,
``a if c else b``, ``min(...)``, ``max(...)``, ``abs(x)``.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import z3

from cuvil.errors import CuvilError

MAX_POWER = 8
MAX_DEPTH = 100


def _depth(tree: ast.AST) -> int:
    """The nesting depth of a tree, without recursion."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


def _char_column(source: str, byte_offset: int) -> int:
    """ast counts UTF-8 bytes from 1; the user counts characters."""
    return len(source.encode()[:max(byte_offset - 1, 0)].decode(errors="ignore")) + 1


class ExprError(CuvilError):
    """A spec expression that cannot be read (syntax, unknown name, wrong kind); ``column`` is the
    1-based character column in the expression's text, when one is at fault."""

    code = "CUVIL-FAILSAFE-SPEC"
    default_hint = "expressions use numbers, names, + - * / **, comparisons, and/or/not, if-else, min, max, abs"

    def __init__(self, message: str, *, column: int | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.column = column


@dataclass(frozen=True)
class Expr:
    """A parsed expression: ``kind`` is ``"real"`` or ``"bool"``; ``names`` the names it reads."""

    text: str
    tree: ast.expr = field(repr=False, compare=False)
    kind: str
    names: frozenset[str]

    def z3(self, env: Mapping[str, z3.ExprRef]) -> z3.ExprRef:
        """The expression as a z3 term, each name read from ``env`` (z3 reals or bools)."""
        return _Z3(env).visit(self.tree)

    def evaluate(self, env: Mapping[str, Any]) -> Any:
        """The expression's value with numpy semantics (``env`` values may be arrays of samples)."""
        return _Numpy(env).visit(self.tree)

    def __str__(self) -> str:
        return self.text


def parse_expr(text: str | int | float | bool, kinds: Mapping[str, str], *, where: str = "",
               expect: str | None = None) -> Expr:
    """Parse ``text`` with ``kinds`` giving each known name's kind (``"real"`` or ``"bool"``);
    ``expect`` checks the result's kind."""
    source = _normalize(text)
    try:
        tree = ast.parse(source, mode="eval").body
    except SyntaxError as e:
        column = _char_column(source, e.offset) if e.offset else len(source) + 1  # 0: at the end of the text
        raise ExprError(f"{source!r} is not an expression: {e.msg} (column {column})", location=where,
                        column=column) from None
    except (RecursionError, MemoryError):
        raise ExprError(f"{source[:40]!r}... nests too deeply", location=where) from None
    if _depth(tree) > MAX_DEPTH:
        raise ExprError(f"{source[:40]!r}... nests deeper than {MAX_DEPTH} levels", location=where,
                        hint="split it with definitions (define)")
    checker = _Kinds(kinds, source, where)
    kind = checker.visit(tree)
    if expect is not None and kind != expect:
        raise ExprError(f"{source!r} is a {_describe(kind)}, where a {_describe(expect)} is expected", location=where)
    return Expr(source, tree, kind, frozenset(checker.names))


def _normalize(text: str | int | float | bool) -> str:
    if isinstance(text, bool):
        return "True" if text else "False"
    if isinstance(text, (int, float)):
        return repr(float(text)) if isinstance(text, float) else str(text)
    out = str(text).strip()
    for word, py in (("true", "True"), ("false", "False")):
        out = _replace_word(out, word, py)
    return out


def _replace_word(text: str, word: str, new: str) -> str:
    import re

    return re.sub(rf"(?<![\w.]){word}(?![\w.])", new, text)


def _describe(kind: str) -> str:
    return "condition (true/false)" if kind == "bool" else "number"


_FUNCTIONS = {"min": 2, "max": 2, "abs": 1}  # minimum arity


class _Kinds(ast.NodeVisitor):
    """Checks the allowed syntax and infers kinds, with the column of anything refused."""

    def __init__(self, kinds: Mapping[str, str], source: str, where: str) -> None:
        self.kinds, self.source, self.where = kinds, source, where
        self.names: set[str] = set()

    def fail(self, node: ast.AST, message: str) -> ExprError:
        col = _char_column(self.source, getattr(node, "col_offset", 0) + 1)
        return ExprError(f"{self.source!r}, column {col}: {message}", location=self.where, column=col)

    def generic_visit(self, node: ast.AST) -> str:
        raise self.fail(node, f"{type(node).__name__} is not allowed in a spec expression")

    def need(self, node: ast.expr, kind: str) -> None:
        got = self.visit(node)
        if got != kind:
            raise self.fail(node, f"{ast.unparse(node)!r} is a {_describe(got)}, a {_describe(kind)} is needed here")

    def visit_Constant(self, node: ast.Constant) -> str:
        if isinstance(node.value, bool):
            return "bool"
        if isinstance(node.value, (int, float)):
            if not np.isfinite(node.value):
                raise self.fail(node, "numbers must be finite")
            return "real"
        raise self.fail(node, f"{node.value!r} is not a number")

    def visit_Name(self, node: ast.Name) -> str:
        if node.id not in self.kinds:
            known = ", ".join(sorted(self.kinds)) or "none"
            raise self.fail(node, f"unknown name {node.id!r} (known: {known})")
        self.names.add(node.id)
        return self.kinds[node.id]

    def visit_BinOp(self, node: ast.BinOp) -> str:
        if not isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow)):
            raise self.fail(node, f"operator {type(node.op).__name__} is not allowed")
        self.need(node.left, "real")
        if isinstance(node.op, ast.Pow):
            exp = node.right
            if not (isinstance(exp, ast.Constant) and isinstance(exp.value, int) and not isinstance(exp.value, bool)
                    and 0 <= exp.value <= MAX_POWER):
                raise self.fail(node, f"a power takes an integer exponent 0..{MAX_POWER}")
            return "real"
        self.need(node.right, "real")
        return "real"

    def visit_UnaryOp(self, node: ast.UnaryOp) -> str:
        if isinstance(node.op, ast.Not):
            self.need(node.operand, "bool")
            return "bool"
        if isinstance(node.op, (ast.USub, ast.UAdd)):
            self.need(node.operand, "real")
            return "real"
        raise self.fail(node, "operator ~ is not allowed")

    def visit_BoolOp(self, node: ast.BoolOp) -> str:
        for v in node.values:
            self.need(v, "bool")
        return "bool"

    def visit_Compare(self, node: ast.Compare) -> str:
        for op in node.ops:
            if not isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Eq, ast.NotEq)):
                raise self.fail(node, f"comparison {type(op).__name__} is not allowed")
        kinds = {self.visit(v) for v in [node.left, *node.comparators]}
        if len(kinds) != 1:
            raise self.fail(node, "a comparison mixes numbers and conditions")
        if kinds == {"bool"} and not all(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
            raise self.fail(node, "conditions are compared with == and != only")
        return "bool"

    def visit_IfExp(self, node: ast.IfExp) -> str:
        self.need(node.test, "bool")
        kind = self.visit(node.body)
        self.need(node.orelse, kind)
        return kind

    def visit_Call(self, node: ast.Call) -> str:
        name = node.func.id if isinstance(node.func, ast.Name) else None
        if name not in _FUNCTIONS or node.keywords:
            raise self.fail(node, "only min(...), max(...) and abs(x) can be called")
        if (name == "abs" and len(node.args) != 1) or (name != "abs" and len(node.args) < 2):
            raise self.fail(node, f"{name} takes {'one argument' if name == 'abs' else 'two or more arguments'}")
        for a in node.args:
            self.need(a, "real")
        return "real"


def _literal(node: ast.Constant) -> int | float | bool:
    value = node.value
    assert isinstance(value, (int, float, bool)), "checked at parse time"
    return value


def _number(value: int | float | bool) -> Fraction:
    """The rational a literal denotes: ``0.1`` is one tenth (its shortest decimal), not the binary float."""
    return Fraction(repr(value)) if isinstance(value, float) else Fraction(int(value))


class _Z3(ast.NodeVisitor):
    def __init__(self, env: Mapping[str, z3.ExprRef]) -> None:
        self.env = env

    def visit_Constant(self, node: ast.Constant) -> Any:
        if isinstance(node.value, bool):
            return z3.BoolVal(node.value)
        q = _number(_literal(node))
        return z3.RealVal(f"{q.numerator}/{q.denominator}")

    def visit_Name(self, node: ast.Name) -> Any:
        return self.env[node.id]

    def visit_BinOp(self, node: ast.BinOp) -> Any:
        left = self.visit(node.left)
        if isinstance(node.op, ast.Pow):
            n = int(node.right.value)  # type: ignore[attr-defined]  # checked at parse time
            out = z3.RealVal(1)
            for _ in range(n):
                out = out * left
            return z3.simplify(out) if n == 0 else out
        right = self.visit(node.right)
        ops: dict[type, Callable[[Any, Any], Any]] = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
                                                      ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}
        return ops[type(node.op)](left, right)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Any:
        v = self.visit(node.operand)
        if isinstance(node.op, ast.Not):
            return z3.Not(v)
        return -v if isinstance(node.op, ast.USub) else v

    def visit_BoolOp(self, node: ast.BoolOp) -> Any:
        vals = [self.visit(v) for v in node.values]
        return z3.And(*vals) if isinstance(node.op, ast.And) else z3.Or(*vals)

    def visit_Compare(self, node: ast.Compare) -> Any:
        terms = [self.visit(v) for v in [node.left, *node.comparators]]
        parts = [_compare(op, a, b) for op, a, b in zip(node.ops, terms, terms[1:], strict=False)]
        return parts[0] if len(parts) == 1 else z3.And(*parts)

    def visit_IfExp(self, node: ast.IfExp) -> Any:
        return z3.If(self.visit(node.test), self.visit(node.body), self.visit(node.orelse))

    def visit_Call(self, node: ast.Call) -> Any:
        name = node.func.id  # type: ignore[attr-defined]  # checked at parse time
        args = [self.visit(a) for a in node.args]
        if name == "abs":
            return z3.If(args[0] >= 0, args[0], -args[0])
        out = args[0]
        for a in args[1:]:
            out = z3.If(a < out, a, out) if name == "min" else z3.If(a > out, a, out)
        return out


def _compare(op: ast.cmpop, a: Any, b: Any) -> Any:
    if isinstance(op, ast.Lt):
        return a < b
    if isinstance(op, ast.LtE):
        return a <= b
    if isinstance(op, ast.Gt):
        return a > b
    if isinstance(op, ast.GtE):
        return a >= b
    if isinstance(op, ast.Eq):
        return a == b
    return a != b


class _Numpy(ast.NodeVisitor):
    def __init__(self, env: Mapping[str, Any]) -> None:
        self.env = env

    def visit_Constant(self, node: ast.Constant) -> Any:
        return node.value if isinstance(node.value, bool) else float(_literal(node))

    def visit_Name(self, node: ast.Name) -> Any:
        return self.env[node.id]

    def visit_BinOp(self, node: ast.BinOp) -> Any:
        left = np.asarray(self.visit(node.left), dtype=np.float64)
        if isinstance(node.op, ast.Pow):
            return left ** int(node.right.value)  # type: ignore[attr-defined]
        right = np.asarray(self.visit(node.right), dtype=np.float64)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        with np.errstate(divide="ignore", invalid="ignore"):
            return left / right

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Any:
        v = self.visit(node.operand)
        if isinstance(node.op, ast.Not):
            return np.logical_not(v)
        return -np.asarray(v, dtype=np.float64) if isinstance(node.op, ast.USub) else v

    def visit_BoolOp(self, node: ast.BoolOp) -> Any:
        vals = [np.asarray(self.visit(v), dtype=bool) for v in node.values]
        f = np.logical_and if isinstance(node.op, ast.And) else np.logical_or
        out = vals[0]
        for v in vals[1:]:
            out = f(out, v)
        return out

    def visit_Compare(self, node: ast.Compare) -> Any:
        terms = [self.visit(v) for v in [node.left, *node.comparators]]
        out: Any = True
        for op, a, b in zip(node.ops, terms, terms[1:], strict=False):
            out = np.logical_and(out, _compare(op, np.asarray(a), np.asarray(b)))
        return out

    def visit_IfExp(self, node: ast.IfExp) -> Any:
        return np.where(self.visit(node.test), self.visit(node.body), self.visit(node.orelse))

    def visit_Call(self, node: ast.Call) -> Any:
        name = node.func.id  # type: ignore[attr-defined]
        args = [np.asarray(self.visit(a), dtype=np.float64) for a in node.args]
        if name == "abs":
            return np.abs(args[0])
        out = args[0]
        for a in args[1:]:
            out = np.minimum(out, a) if name == "min" else np.maximum(out, a)
        return out
