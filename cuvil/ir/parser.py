"""The CIR text format, reading side: ``parse_module(print_module(m)) == m``.

Grammar (``#`` starts a comment)::

    module    := "module" ["attributes" "{" (key "=" STRING),* "}"] "{" (const | func)* "}"
    const     := "const" "@" name ":" type "=" (literal | base64"...")
    func      := "func" "@" name "(" (%name ":" type),* ")" "->" "(" (%name ":" type),* ")"
                 ["where" constraint,*] "{" stmt* "return" ref,* "}"
    stmt      := %name "=" op "(" ref,* ")" ["{" (key "=" attr),* "}"] ":" type
    ref       := %name | @name
    type      := dtype "[" dim,* "]"                    dim: 3, N, 2*N + 1, (H - 3) // 2 + 1, max(N, 4)
    attr      := 3 | -1.5 | 1e-05 | inf | nan | true | false | none | "text" | f16 | dim | "[" attr,* "]"
               | "region" "(" (%name ":" type),* ")" "{" stmt* "yield" ref "}"
    constraint:= lo "<=" SYM ["<=" hi] | SYM "<=" hi | SYM "%" m "==" "0"
    literal   := element | "[" literal,* "]"            element: 1.5, -0.0, inf, nan, 7, true

Values are rebuilt through the hash-consing table, so parsing the printed form of a live
module yields its very objects. Attributes an op's definition gives a default may be left
out. After parsing, the module goes through the well-formedness checker, whose errors then
point at the offending line.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import json
import os
import re
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

import numpy as np

from cuvil.errors import OpDefinitionError, ParseError, UnsupportedOpError
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Function, Module, content_hash, frozen_array
from cuvil.ir.opdef import REQUIRED, OpDef, get_op
from cuvil.ir.region import Region
from cuvil.ir.symbolic import Dim, Sym, sym_max, sym_min
from cuvil.ir.types import DimConstraint, TensorType
from cuvil.ir.values import Value, normalize_attr, param

_TOKEN = re.compile(r"""
    (?P<ws>(?:\s+|\#[^\n]*)+)
  | (?P<b64>base64"[A-Za-z0-9+/=]*")
  | (?P<str>"(?:[^"\\\n]|\\.)*")
  | (?P<float>\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)
  | (?P<int>\d+)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>->|<=|==|//|[{}()\[\],:=%@*+\-<])
""", re.VERBOSE)
_HASH_KEY = re.compile(r"k[0-9a-f]{20}")
_DTYPES = {d.value: d for d in DType}

GRAMMAR_HINT = "the .cir grammar is described at the top of cuvil/ir/parser.py; `cuvil ir MODEL` shows examples"
STMT_HINT = "a function body holds lines `%name = op(%a, @const) {attr = value} : f32[N, 4]` and ends with `return`"


class Token(NamedTuple):
    kind: str  # b64 str float int ident punct eof
    text: str
    pos: int

    def show(self) -> str:
        if self.kind == "eof":
            return "end of input"
        text = self.text if len(self.text) <= 40 else self.text[:37] + "..."
        return repr(text)


class _Parser:
    def __init__(self, text: str, filename: str | None, verify: bool = True) -> None:
        self.text = text
        self.verify = verify
        self.filename = filename or "<string>"
        self._line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.tokens = self._tokenize()
        self.i = 0
        self.constants: dict[str, np.ndarray] = {}
        self.const_types: dict[str, TensorType] = {}
        self.const_names: dict[str, str] = {}
        self.locations: dict[Value, str] = {}

    # positions and errors ------------------------------------------------------------
    def where(self, pos: int) -> str:
        line = bisect.bisect_right(self._line_starts, pos)
        col = pos - self._line_starts[line - 1] + 1
        return f"{self.filename}:{line}:{col}"

    def fail(self, tok: Token, message: str, hint: str = "", *, found: bool = True) -> NoReturn:
        """Raise at ``tok``; syntax errors name the token found there."""
        text = f"{message}, found {tok.show()}" if found else message
        raise ParseError(text, location=self.where(tok.pos), hint=hint or GRAMMAR_HINT)

    def _tokenize(self) -> list[Token]:
        out: list[Token] = []
        text = self.text
        pos = 0
        for m in _TOKEN.finditer(text):
            if m.start() != pos:
                self._bad_character(pos)
            pos = m.end()
            kind = m.lastgroup or "punct"
            if kind != "ws":
                out.append(Token(kind, m.group(), m.start()))
        if pos != len(text):
            self._bad_character(pos)
        out.append(Token("eof", "", len(text)))
        return out

    def _bad_character(self, pos: int) -> NoReturn:
        ch = self.text[pos]
        if ch == '"' or self.text.startswith('base64"', pos):
            raise ParseError("unterminated or malformed string", location=self.where(pos),
                             hint='strings are JSON strings on one line: "like \\"this\\""')
        raise ParseError(f"unexpected character {ch!r}", location=self.where(pos), hint=GRAMMAR_HINT)

    # token helpers -------------------------------------------------------------------
    def peek(self, ahead: int = 0) -> Token:
        j = self.i + ahead
        return self.tokens[j] if j < len(self.tokens) else self.tokens[-1]

    def next(self) -> Token:
        tok = self.tokens[self.i]
        if tok.kind != "eof":
            self.i += 1
        return tok

    def at(self, text: str, ahead: int = 0) -> bool:
        """Whether the token ``ahead`` is the punctuation or keyword ``text`` (strings and numbers
        never spell one: their text keeps its quotes or is all digits)."""
        return self.peek(ahead).text == text

    def accept(self, text: str) -> bool:
        if self.at(text):
            self.next()
            return True
        return False

    def expect(self, text: str, hint: str = "") -> Token:
        tok = self.peek()
        if not self.at(text):
            self.fail(tok, f"expected {text!r}", hint)
        return self.next()

    def name(self, what: str, allow_int: bool = False) -> tuple[str, Token]:
        tok = self.next()
        if tok.kind == "ident" or (allow_int and tok.kind == "int"):
            return tok.text, tok
        if tok.kind == "str":
            return self.string(tok), tok
        self.fail(tok, f"expected {what}", 'names are identifiers or JSON strings (%"input.1")')

    def string(self, tok: Token) -> str:
        try:
            return json.loads(tok.text)
        except json.JSONDecodeError as e:
            self.fail(tok, f"malformed string ({e.msg})", "strings use JSON escapes")

    def comma_list(self, close: str, item: Any) -> list[Any]:
        """``item (',' item)* close`` (possibly empty); the opening bracket is already taken."""
        out: list[Any] = []
        if self.accept(close):
            return out
        while True:
            out.append(item())
            if self.accept(close):
                return out
            tok = self.peek()
            if not self.accept(","):
                self.fail(tok, f"expected ',' or {close!r}")

    # dims and types --------------------------------------------------------------------
    def dim(self) -> Dim:
        """A dim expression: ints, symbols, + - * // %, max/min, parentheses."""
        v = self._dim_term()
        while self.at("+") or self.at("-"):
            op = self.next().text
            r = self._dim_term()
            v = v + r if op == "+" else v - r
        return v

    def _dim_term(self) -> Dim:
        v = self._dim_unary()
        while self.at("*") or self.at("//") or self.at("%"):
            op = self.next().text
            tok = self.peek()
            r = self._dim_unary()
            if op == "*":
                v = v * r
                continue
            if isinstance(r, int) and r == 0 and isinstance(v, int):
                self.fail(tok, "division by zero in a dim expression", "dims divide by non-zero values", found=False)
            if isinstance(v, int) and isinstance(r, int):
                v = v // r if op == "//" else v % r
            else:
                v = Sym.lift(v) // r if op == "//" else Sym.lift(v) % r
                v = v.simplify() if isinstance(v, Sym) else v
        return v

    def _dim_unary(self) -> Dim:
        if self.accept("-"):
            return -self._dim_unary()
        tok = self.next()
        if tok.kind == "int":
            return int(tok.text)
        if tok.kind == "punct" and tok.text == "(":
            v = self.dim()
            self.expect(")")
            return v
        if tok.kind == "ident":
            if tok.text in ("max", "min") and self.at("("):
                self.next()
                a = self.dim()
                self.expect(",")
                b = self.dim()
                self.expect(")")
                return sym_max(a, b) if tok.text == "max" else sym_min(a, b)
            return Sym.symbol(tok.text)
        self.fail(tok, "expected a dim (an integer, a symbol or an expression such as 2*N + 1)")

    def type_(self) -> TensorType:
        tok = self.next()
        dtype = _DTYPES.get(tok.text) if tok.kind == "ident" else None
        if dtype is None:
            self.fail(tok, "expected a tensor type", "a type is a dtype and a shape: f32[N, 3], i64[] "
                      f"(dtypes: {', '.join(_DTYPES)})")
        self.expect("[", "a type is a dtype and a shape: f32[N, 3]")
        shape = self.comma_list("]", self.dim)
        return TensorType(dtype, tuple(shape))

    # attributes --------------------------------------------------------------------------
    def attr_value(self) -> Any:
        tok = self.peek()
        if self.at("region") and self.at("(", 1):
            return self.region()
        if tok.kind == "punct" and tok.text == "[":
            self.next()
            return tuple(self.comma_list("]", self.attr_value))
        if tok.kind == "str":
            self.next()
            return self.string(tok)
        if tok.kind == "ident":
            word = tok.text
            if word in ("true", "false"):
                self.next()
                return word == "true"
            if word == "none":
                self.next()
                return None
            if word in ("inf", "nan"):
                self.next()
                return float(word)
            if word in _DTYPES:
                self.next()
                return _DTYPES[word]
        if tok.kind == "float":
            self.next()
            return float(tok.text)
        if self.at("-") and (self.peek(1).kind == "float" or self.peek(1).text in ("inf", "nan")):
            self.next()
            return -float(self.next().text)
        if tok.kind in ("int", "ident") or self.at("(") or self.at("-"):
            return self.dim()
        self.fail(tok, "expected an attribute value",
                  "attribute values: 3, 1.5, -0.0, inf, true, \"text\", f16, N + 1, none, [list, of, values]")

    def attr_dict(self) -> dict[str, Any]:
        self.expect("{")
        out: dict[str, Any] = {}

        def item() -> None:
            key, tok = self.name("an attribute name")
            self.expect("=", "attributes are written {name = value, ...}")
            if key in out:
                self.fail(tok, f"attribute {key!r} is given twice", "give each attribute once", found=False)
            out[key] = self.attr_value()

        self.comma_list("}", item)
        return out

    # constants ------------------------------------------------------------------------------
    def constant(self) -> None:
        start = self.expect("const")
        self.expect("@")
        key, tok = self.name("a constant name")
        if key in self.const_names:
            self.fail(tok, f"constant @{key} is declared twice", "constant names are unique in a module",
                      found=False)
        self.expect(":", "a constant is `const @name : f32[2] = [1.0, 2.0]`")
        ttok = self.peek()
        t = self.type_()
        if not t.is_static:
            self.fail(ttok, f"constant @{key} has a symbolic shape {t}", "constants have static shapes", found=False)
        self.expect("=")
        data_tok = self.peek()
        if data_tok.kind == "b64":
            self.next()
            arr = self._decode_base64(data_tok, t, key)
        else:
            arr = self._literal(t)
        if _HASH_KEY.fullmatch(key) and content_hash(arr) != key:
            raise ParseError(f"the data of constant @{key} does not match its content hash "
                             f"({content_hash(arr)})", location=self.where(start.pos),
                             hint="the file was edited or corrupted; constants named k<hash> are checked "
                                  "against their data (use another name for hand-written constants)")
        # a module stores constants under their content hash (cuvil.ir.hashing relies on it), so a
        # hand-written name is an alias for that key
        stored = content_hash(arr)
        self.constants[stored] = frozen_array(arr)
        self.const_types[stored] = t
        self.const_names[key] = stored

    def _decode_base64(self, tok: Token, t: TensorType, key: str) -> np.ndarray:
        try:
            raw = base64.b64decode(tok.text[len('base64"'):-1], validate=True)
        except (binascii.Error, ValueError) as e:
            self.fail(tok, f"malformed base64 data for @{key} ({e})", "base64 data is the raw little-endian bytes",
                      found=False)
        le = t.dtype.np.newbyteorder("<")
        count = 1
        for d in t.shape:
            count *= int(d)
        if len(raw) != count * le.itemsize:
            self.fail(tok, f"constant @{key} has {len(raw)} bytes of data, its type {t} needs "
                           f"{count * le.itemsize}", "base64 data is the raw little-endian bytes, row-major",
                      found=False)
        arr = np.frombuffer(raw, dtype=le).astype(t.dtype.np)
        return arr.reshape(tuple(int(d) for d in t.shape))

    def _literal(self, t: TensorType) -> np.ndarray:
        shape = tuple(int(d) for d in t.shape)
        flat: list[Any] = []
        self._literal_level(shape, 0, t.dtype, flat)
        dtype = t.dtype
        if dtype.is_float:
            return np.array(flat, dtype=np.float64).astype(dtype.np).reshape(shape)
        if dtype is DType.bool:
            return np.array(flat, dtype=np.bool_).reshape(shape)
        return np.array(flat, dtype=dtype.np).reshape(shape)

    def _literal_level(self, shape: tuple[int, ...], depth: int, dtype: DType, flat: list[Any]) -> None:
        if depth == len(shape):
            flat.append(self._element(dtype))
            return
        open_tok = self.peek()
        self.expect("[", f"a constant of shape {list(shape)} is written as nested lists")
        count = 0
        if not self.accept("]"):
            while True:
                self._literal_level(shape, depth + 1, dtype, flat)
                count += 1
                if self.accept("]"):
                    break
                tok = self.peek()
                if not self.accept(","):
                    self.fail(tok, "expected ',' or ']' in a constant literal")
        if count != shape[depth]:
            self.fail(open_tok, f"this list has {count} entries, dim {depth} of the constant's type is "
                                f"{shape[depth]}", "a constant is written as nested lists matching its shape",
                      found=False)

    def _element(self, dtype: DType) -> Any:
        neg = self.accept("-")
        tok = self.next()
        if dtype is DType.bool:
            if not neg and tok.kind == "ident" and tok.text in ("true", "false"):
                return tok.text == "true"
            self.fail(tok, "expected true or false in a bool constant", "bool constants hold true and false")
        if dtype.is_float:
            if tok.kind in ("float", "int") or (tok.kind == "ident" and tok.text in ("inf", "nan")):
                v = float(tok.text)
                return -v if neg else v
            self.fail(tok, f"expected a number in a {dtype} constant", "float elements: 1.5, -0.0, 1e-05, inf, nan")
        if tok.kind != "int":
            self.fail(tok, f"expected an integer in a {dtype} constant", "integer elements: 3, -7")
        v = -int(tok.text) if neg else int(tok.text)
        lo, hi = dtype.min_value, dtype.max_value
        if not lo <= v <= hi:
            self.fail(tok, f"{v} is out of range for {dtype} ({lo}..{hi})", "use a wider dtype", found=False)
        return v

    # functions -----------------------------------------------------------------------------
    def ref(self, scope: dict[str, Value]) -> Value:
        tok = self.next()
        if tok.kind == "punct" and tok.text == "%":
            name, ntok = self.name("a value name", allow_int=True)
            if name not in scope:
                self.fail(ntok, f"value %{name} is not defined",
                          "values are defined before use: parameters, or earlier `%name = op(...)` lines",
                          found=False)
            return scope[name]
        if tok.kind == "punct" and tok.text == "@":
            key, ktok = self.name("a constant name")
            key = self.const_names.get(key, key)
            t = self.const_types.get(key)
            if t is None:
                self.fail(ktok, f"constant @{key} is not declared",
                          "declare constants (`const @name : type = data`) before the functions using them",
                          found=False)
            return Value("const", (), {"hash": key}, t)
        self.fail(tok, "expected a value (%name) or a constant (@name)")

    def param_item(self, scope: dict[str, Value], params: list[Value]) -> None:
        self.expect("%")
        pname, ptok = self.name("a parameter name", allow_int=True)
        if pname in scope:
            self.fail(ptok, f"parameter %{pname} is declared twice", "parameter names are unique", found=False)
        self.expect(":")
        p = param(pname, self.type_())
        scope[pname] = p
        params.append(p)
        self.locations.setdefault(p, self.where(ptok.pos))

    def region(self) -> Region:
        """``region(%arg0: f32[4], ...) { stmt* yield %v, ... }``: a body with its own names."""
        self.expect("region")
        self.expect("(")
        scope: dict[str, Value] = {}
        params: list[Value] = []
        self.comma_list(")", lambda: self.param_item(scope, params))
        self.expect("{", "a region body follows in braces")
        while not self.at("yield"):
            self.statement(scope)
        self.next()
        results = [self.ref(scope)]
        while self.accept(","):
            results.append(self.ref(scope))
        self.expect("}", "`yield` is a region's last line")
        return Region(tuple(params), results[0], tuple(results[1:]))

    def function(self) -> Function:
        self.expect("func")
        self.expect("@")
        fname, _ = self.name("a function name")
        self.expect("(", "a function is `func @name(%x: f32[N]) -> (%y: f32[N]) { ... }`")
        scope: dict[str, Value] = {}
        params: list[Value] = []

        self.comma_list(")", lambda: self.param_item(scope, params))
        self.expect("->", "the parameters are followed by `-> (%result: type, ...)`")
        self.expect("(")
        results: list[tuple[str, TensorType, Token]] = []

        def result_item() -> None:
            self.expect("%")
            rname, rtok = self.name("a result name", allow_int=True)
            self.expect(":")
            results.append((rname, self.type_(), rtok))

        self.comma_list(")", result_item)
        constraints = self.constraints() if self.accept("where") else []
        self.expect("{", "the function body follows in braces")
        while not self.at("return"):
            self.statement(scope)
        ret = self.next()
        returned: list[Value] = []
        if not self.at("}"):
            returned.append(self.ref(scope))
            while self.accept(","):
                returned.append(self.ref(scope))
        self.expect("}", "`return` is the function's last line")
        if len(returned) != len(results):
            self.fail(ret, f"@{fname} declares {len(results)} results but returns {len(returned)} values",
                      "`return` lists one value per declared result", found=False)
        for (rname, rtype, rtok), v in zip(results, returned, strict=True):
            if v.type != rtype:
                self.fail(rtok, f"result %{rname} is declared {rtype}, but the returned value is {v.type}",
                          "the signature's result types must equal the returned values' types", found=False)
        return Function(fname, tuple(params), tuple(returned), tuple(r[0] for r in results), tuple(constraints))

    def constraints(self) -> list[DimConstraint]:
        out: list[DimConstraint] = []
        attachable = False  # whether a `S % m == 0` may join the previous bound on the same symbol
        while True:
            tok = self.peek()
            if tok.kind == "ident" and self.at("%", 1):
                self.next()
                self.next()
                m = self._signed_int()
                self.expect("==")
                zero = self.next()
                if zero.text != "0":
                    self.fail(zero, "expected 0", "divisibility is written `N % 8 == 0`")
                if m < 1:
                    self.fail(tok, f"modulus {m} must be positive", "divisibility is written `N % 8 == 0`", found=False)
                if attachable and out[-1].symbol == tok.text and out[-1].multiple_of == 1:
                    prev = out.pop()
                    out.append(DimConstraint(prev.symbol, prev.lo, prev.hi, m))
                else:
                    out.append(DimConstraint(tok.text, multiple_of=m))
                attachable = False
            elif tok.kind == "ident":
                self.next()
                self.expect("<=", "bounds are written `1 <= N <= 64` or `N <= 64`")
                out.append(DimConstraint(tok.text, hi=self._signed_int()))
                attachable = True
            elif tok.kind == "int" or self.at("-"):
                lo = self._signed_int()
                self.expect("<=", "bounds are written `1 <= N <= 64`")
                stok = self.next()
                if stok.kind != "ident":
                    self.fail(stok, "expected a symbol")
                hi = self._signed_int() if self.accept("<=") else None
                out.append(DimConstraint(stok.text, lo, hi))
                attachable = True
            else:
                self.fail(tok, "expected a constraint", "constraints: `1 <= N <= 64`, `N % 8 == 0`")
            if not self.accept(","):
                return out

    def _signed_int(self) -> int:
        neg = self.accept("-")
        tok = self.next()
        if tok.kind != "int":
            self.fail(tok, "expected an integer")
        return -int(tok.text) if neg else int(tok.text)

    def statement(self, scope: dict[str, Value]) -> None:
        tok = self.peek()
        if not self.at("%"):
            self.fail(tok, "expected a value definition, `return` or `yield`", STMT_HINT)
        self.next()
        name, ntok = self.name("a value name", allow_int=True)
        if name in scope:
            self.fail(ntok, f"value %{name} is defined twice", "SSA values are defined once", found=False)
        self.expect("=", STMT_HINT)
        op_tok = self.next()
        if op_tok.kind != "ident":
            self.fail(op_tok, "expected an op name", STMT_HINT)
        try:
            opdef: OpDef | None = get_op(op_tok.text)
        except UnsupportedOpError:
            opdef = None
        if opdef is None or op_tok.text in ("param", "const"):
            self.fail(op_tok, f"unknown op {op_tok.text!r}", "run `cuvil ops` for the op catalogue", found=False)
        self.expect("(", STMT_HINT)
        operands = self.comma_list(")", lambda: self.ref(scope))
        attrs = self.attr_dict() if self.at("{") else {}
        self.expect(":", "an op line ends with its result type: `: f32[N, 4]`")
        t = self.type_()
        v = Value(op_tok.text, tuple(operands), self._complete_attrs(opdef, attrs, op_tok), t)
        scope[name] = v
        self.locations.setdefault(v, self.where(ntok.pos))

    def _complete_attrs(self, opdef: OpDef, attrs: dict[str, Any], tok: Token) -> dict[str, Any]:
        """Fill in defaults and bring values to their declared kinds (``alpha = 1`` -> 1.0).
        Unverified parsing only fills defaults, so malformed IR can still be read and inspected."""
        if not self.verify:
            full = dict(attrs)
            for a in opdef.attrs:
                if a.name not in full and a.default is not REQUIRED:
                    full[a.name] = normalize_attr(a.default)
            return full
        try:
            return opdef.check_attrs(attrs)
        except OpDefinitionError as e:
            raise ParseError(e.message, location=self.where(tok.pos), hint=e.hint) from None

    # module --------------------------------------------------------------------------------
    def module(self) -> Module:
        self.expect("module", "a .cir file holds one `module { ... }`")
        metadata: dict[str, str] = {}
        if self.accept("attributes"):
            for k, v in self.attr_dict().items():
                if not isinstance(v, str):
                    self.fail(self.peek(), f"module attribute {k!r} must be a string", 'write it quoted: key = "value"',
                              found=False)
                metadata[k] = v
        self.expect("{")
        functions: list[Function] = []
        names: set[str] = set()
        while not self.accept("}"):
            tok = self.peek()
            if self.at("const"):
                self.constant()
            elif self.at("func"):
                fn = self.function()
                if fn.name in names:
                    self.fail(tok, f"function @{fn.name} is defined twice", "function names are unique in a module",
                              found=False)
                names.add(fn.name)
                functions.append(fn)
            else:
                self.fail(tok, "expected `const`, `func` or '}'", "a module holds constants and functions")
        tok = self.peek()
        if tok.kind != "eof":
            self.fail(tok, "expected end of input after the module", "a .cir file holds exactly one module")
        return Module(tuple(functions), self.constants, metadata)


def parse_module(text: str, filename: str | None = None, *, verify: bool = True) -> Module:
    """Parse .cir text. With ``verify`` (the default) the module is also checked for
    well-formedness, with errors located at the offending line."""
    p = _Parser(text, filename, verify)
    try:
        module = p.module()
    except RecursionError:
        raise ParseError("expressions or lists are nested too deeply", location=p.where(p.peek().pos),
                         hint="nest brackets and parentheses at most a few hundred levels") from None
    if verify:
        from cuvil.ir.wellformed import check_module

        check_module(module, locations=p.locations)
    return module


def load_ir(path: str | os.PathLike) -> Module:
    """Read a .cir file written by :func:`cuvil.ir.printer.export_ir`."""
    path = Path(path)
    if not path.is_file():
        from cuvil.errors import ModelLoadError

        raise ModelLoadError(f"file {path} does not exist", location=str(path))
    return parse_module(path.read_text(encoding="utf-8"), filename=str(path))


__all__ = ["load_ir", "parse_module"]
