"""``cuvil ops``: the compatibility table, generated from the registries (op catalogue, frontend
converters, the readers of the compute rules, the tuned kernels), so the list cannot drift from
the code; ``cuvil ops NAME``: one op in detail, its compute rule printed."""

from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from cuvil.cli.common import EXIT_CODES, EXIT_OK
from cuvil.errors import UsageError

if TYPE_CHECKING:  # the catalogue is imported when a command runs, not when the parser is built
    from cuvil.ir.dtypes import DType
    from cuvil.ir.opdef import OpDef
    from cuvil.ir.rules import Expr
    from cuvil.ir.types import TensorType

NOT_YET = "not yet"
TORCH_MISSING = "torch not installed"

READERS = {"z3": ("verify.scalar_semantics", "verify.cone_encoder"),
           "llvm": ("cuvil.codegen.scalar", "cuvil.codegen.lower_rule")}
"""The modules of each compute-rule reader that publish what it implements: ``SUPPORTED_PRIMITIVES``
and ``SUPPORTED_REDUCTIONS`` (element kind ``float`` / ``int`` / ``bool`` -> names). Readers see an
op only through its rule, so a reader handles an op when every primitive and reduction the rule
uses on the op's catalogue examples is in its tables."""

SUPPORTED = {"z3": "yes", "llvm": "loop nest from the rule"}
"""A reader's cell for an op whose rule it fully implements (LLVM: unless a tuned kernel applies)."""


# --------------------------------------------------------------------------------------
# what the readers implement, and what an op's rule uses


class Use(NamedTuple):
    """A primitive or reduction a rule applies to elements of one kind."""

    what: str  # "primitive" | "reduction"
    name: str
    kind: str  # "float" | "int" | "bool"

    def __str__(self) -> str:
        return f"{self.name} on {self.kind}" if self.what == "primitive" else f"{self.name}-reduction on {self.kind}"


def element_kind(dtype: DType) -> str:
    return "float" if dtype.is_float else "int" if dtype.is_int else "bool"


def rule_uses(rule: Expr) -> set[Use]:
    """The primitives (by operand kind; a select by its branches') and reductions ``rule`` applies."""
    from cuvil.ir import rules as R
    from cuvil.ir.rule_text import nodes

    out: set[Use] = set()
    for e in nodes(rule):
        if isinstance(e, R.Call):
            out.add(Use("primitive", e.fn, element_kind((e if e.fn == "select" else e.args[0]).dtype)))
        elif isinstance(e, R.Reduce):
            out.add(Use("reduction", e.kind, element_kind(e.dtype)))
    return out


@dataclass(frozen=True)
class ReaderSupport:
    """What one reader of the compute rules implements, by element kind."""

    primitives: Mapping[str, frozenset[str]]
    reductions: Mapping[str, frozenset[str]]

    @staticmethod
    def of(modules: Sequence[str]) -> ReaderSupport:
        tables: dict[str, Mapping[str, frozenset[str]]] = {}
        for name in modules:
            mod = importlib.import_module(name)
            for attr in ("SUPPORTED_PRIMITIVES", "SUPPORTED_REDUCTIONS"):
                if hasattr(mod, attr):
                    tables[attr] = getattr(mod, attr)
        return ReaderSupport(tables.get("SUPPORTED_PRIMITIVES", {}), tables.get("SUPPORTED_REDUCTIONS", {}))

    def missing(self, uses: Iterable[Use]) -> list[str]:
        """The uses this reader does not implement, as text."""
        out = set()
        for u in uses:
            table = self.primitives if u.what == "primitive" else self.reductions
            if u.name not in table.get(u.kind, frozenset()):
                out.add(str(u))
        return sorted(out)


@dataclass(frozen=True)
class Example:
    """One catalogue example of an op at the type level: operand types, attributes, result, rule."""

    types: tuple[TensorType, ...]
    attrs: Mapping[str, Any]
    out: TensorType
    rule: Expr


def examples(op: OpDef) -> list[Example]:
    """The op's catalogue examples with their rules built (cheap: rules are symbolic)."""
    import numpy as np

    from cuvil.ir.dtypes import DType
    from cuvil.ir.types import TensorType

    if op.examples is None or op.structured:  # a loop has no element rule
        return []
    out = []
    for arrays, attrs in op.examples(np.random.default_rng(0)):
        full = op.check_attrs(attrs)
        types = tuple(TensorType(DType.from_numpy(a.dtype), a.shape) for a in arrays)
        result = op.infer(types, full)
        out.append(Example(types, attrs, result, op.make_rule(types, full, result)))
    return out


def _reader_cells(op: OpDef, readers: Mapping[str, ReaderSupport], tuned: Mapping[str, str],
                  cases: Sequence[Example]) -> dict[str, str]:
    """The z3 and LLVM cells of one op."""
    if op.structured:
        return {name: STRUCTURED[op.name][name] for name in readers}
    if not cases:
        return {name: "unknown (no catalogue examples)" for name in readers}
    uses = set().union(*(rule_uses(c.rule) for c in cases))
    cells = {}
    for name, support in readers.items():
        missing = support.missing(uses)
        if missing:
            cells[name] = "no: " + ", ".join(missing)
        elif name == "llvm" and op.name in tuned:
            cells[name] = f"{tuned[op.name]}; else {SUPPORTED[name]}"
        else:
            cells[name] = SUPPORTED.get(name, "yes")
    return cells


# --------------------------------------------------------------------------------------
# the compatibility table


def _onnx_sources() -> tuple[dict[str, list[str]], list[dict[str, Any]]]:
    """CIR op -> ONNX op types whose converters emit it; and the ONNX rows."""
    from cuvil.frontend.onnx_import import converters

    by_op: dict[str, list[str]] = {}
    rows = []
    for (domain, op_type), entry in sorted(converters().items()):
        label = f"{domain}::{op_type}" if domain else op_type
        rows.append({"onnx_op": label, "domain": domain or "ai.onnx", "cir_ops": list(entry.cir_ops)})
        for op in entry.cir_ops:
            by_op.setdefault(op, []).append(label)
    return by_op, rows


def _torch_sources() -> dict[str, list[str]] | str:
    """CIR op -> aten ops whose converters emit it, or the reason there are none."""
    if importlib.util.find_spec("torch") is None:
        return TORCH_MISSING
    if importlib.util.find_spec("cuvil.frontend.torch_import") is None:
        return NOT_YET
    try:
        from cuvil.frontend import torch_import

        table = torch_import.aten_converters()
    except (ImportError, AttributeError):
        return NOT_YET
    by_op: dict[str, list[str]] = {}
    for key, entry in table.items():
        label = str(getattr(entry, "op_type", None) or (key[-1] if isinstance(key, tuple) else key))
        for op in getattr(entry, "cir_ops", ()):
            by_op.setdefault(op, []).append(label)
    return {k: sorted(set(v)) for k, v in by_op.items()}


STRUCTURED = {
    "loop": {"interpreter": "its body iterated", "z3": "a cut point: same body or bodies proved equal",
             "llvm": "a real loop over its body's kernels"},
    "cond": {"interpreter": "the chosen region run", "z3": "a cut point: same regions or regions proved equal",
             "llvm": "a real branch to one region's kernels"},
}
"""How each reader handles control flow (an op whose meaning is a region it runs)."""


def _interpreter_cell(op: OpDef) -> str:
    if op.structured:
        return STRUCTURED[op.name]["interpreter"]
    return "rule + fast path" if op.numpy is not None else "rule only"


def _readers() -> tuple[dict[str, ReaderSupport], dict[str, str]]:
    from cuvil.codegen.kernels import tuned_kernels

    return {name: ReaderSupport.of(mods) for name, mods in READERS.items()}, tuned_kernels()


def compatibility_table() -> dict[str, Any]:
    """One row per catalogue op (which frontends produce it, which readers handle it),
    plus one row per ONNX op type with its CIR lowering."""
    from cuvil.ir.opdef import all_ops

    onnx_by_op, onnx_rows = _onnx_sources()
    torch_by_op = _torch_sources()
    readers, tuned = _readers()
    rows = []
    for op in all_ops():
        torch_cell = torch_by_op if isinstance(torch_by_op, str) else ", ".join(torch_by_op.get(op.name, [])) or "—"
        rows.append({
            "op": op.name,
            "family": op.family,
            "onnx": ", ".join(onnx_by_op.get(op.name, [])) or "—",
            "torch": torch_cell,
            "interpreter": _interpreter_cell(op),
            **_reader_cells(op, readers, tuned, examples(op)),
        })
    for r in onnx_rows:
        r["cir_ops"] = ", ".join(r["cir_ops"]) or "— (forwards its input)"
    return {"ops": rows, "onnx": onnx_rows}


OP_COLUMNS = (("op", "CIR op"), ("family", "family"), ("onnx", "ONNX import"), ("torch", "torch import"),
              ("interpreter", "interpreter"), ("z3", "z3"), ("llvm", "LLVM"))
ONNX_COLUMNS = (("onnx_op", "ONNX op"), ("cir_ops", "CIR lowering"))


def _markdown(rows: list[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(title for _, title in columns) + " |",
             "|" + "|".join(" --- " for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(r[k]) for k, _ in columns) + " |" for r in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# one op in detail


def _value(v: Any) -> Any:
    """An attribute value as JSON: dtypes and dims by name, tuples as lists."""
    if isinstance(v, (list, tuple)):
        return [_value(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def _operand_names(op: OpDef, count: int) -> list[str]:
    """Operand names for a call with ``count`` operands (a variadic one numbered: xs0, xs1, ...)."""
    names: list[str] = []
    fixed = len(op.operands) - 1
    for o in op.operands:
        if o.startswith("*"):
            names += [f"{o[1:]}{k}" for k in range(count - fixed)]
        else:
            names.append(o)
    return names


def _unknown_op(name: str, known: Sequence[str]) -> UsageError:
    close = difflib.get_close_matches(name, known, n=3)
    hint = ("did you mean " + ", ".join(close) + "? " if close else "") + "`cuvil ops` lists every op"
    return UsageError(f"CIR has no op {name!r}", location=name, hint=hint)


def op_detail(name: str) -> dict[str, Any]:
    """Everything about one op: signature, properties, shape rule, the readers' support, the
    frontends that emit it, and its compute rule built on its first catalogue example."""
    from cuvil.ir.opdef import OPS, REQUIRED
    from cuvil.ir.rule_text import rule_text

    op = OPS.get(name)
    if op is None:
        raise _unknown_op(name, sorted(OPS))
    readers, tuned = _readers()
    cases = examples(op)
    onnx_by_op, _ = _onnx_sources()
    torch_by_op = _torch_sources()
    shape = op.shape
    detail: dict[str, Any] = {
        "op": op.name, "family": op.family, "doc": op.doc,
        "operands": [{"name": o.lstrip("*"), "variadic": o.startswith("*")} for o in op.operands],
        "attributes": [{"name": a.name, "kind": a.kind, "required": a.default is REQUIRED,
                        "default": None if a.default is REQUIRED else _value(a.default)} for a in op.attrs],
        "properties": {"commutative": op.commutative and (op.commutative_float or "integers only"),
                       "contraction": op.contraction,
                       "epilogue_fusible": op.epilogue_fusible, "precision_policy": op.precision_policy},
        "shape_rule": {"name": f"{getattr(shape, '__module__', '?')}.{getattr(shape, '__qualname__', shape)}",
                       "doc": (getattr(shape, "__doc__", None) or "").strip()},
        "readers": {"interpreter": _interpreter_cell(op), **_reader_cells(op, readers, tuned, cases)},
        "onnx": onnx_by_op.get(op.name, []),
        "torch": torch_by_op if isinstance(torch_by_op, str) else torch_by_op.get(op.name, []),
        "rule": None,
    }
    if cases:
        first = cases[0]
        names = _operand_names(op, len(first.types))
        detail["rule"] = {
            "example": {"operands": {n: str(t) for n, t in zip(names, first.types, strict=True)},
                        "attrs": {k: _value(v) for k, v in first.attrs.items()}, "result": str(first.out)},
            "text": rule_text(first.rule, names, first.out.rank),
        }
    return detail


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _commutative(flag: bool | str) -> str:
    return flag if isinstance(flag, str) else _yes(flag)


def detail_text(d: Mapping[str, Any]) -> str:
    """``op_detail`` for a terminal: the doc first (it states layouts such as pad's begins-then-ends)."""
    attrs = [f"{a['name']}: {a['kind']}" + (", required" if a["required"] else f" = {a['default']!r}")
             for a in d["attributes"]] or ["none"]
    props = d["properties"]
    torch = d["torch"] if isinstance(d["torch"], str) else ", ".join(d["torch"]) or "—"
    shape = d["shape_rule"]["name"] + (f": {d['shape_rule']['doc']}" if d["shape_rule"]["doc"] else "")
    rows = [
        ("operands", [", ".join(("*" if o["variadic"] else "") + o["name"] for o in d["operands"]) or "none"]),
        ("attributes", attrs),
        ("properties", [f"commutative: {_commutative(props['commutative'])}; "
                        f"contraction: {_yes(props['contraction'])}; "
                        f"epilogue-fusible: {_yes(props['epilogue_fusible'])}; "
                        f"precision: {props['precision_policy']}"]),
        ("shape rule", [shape]),
        ("interpreter", [d["readers"]["interpreter"]]),
        ("z3", [d["readers"]["z3"]]),
        ("LLVM", [d["readers"]["llvm"]]),
        ("ONNX import", [", ".join(d["onnx"]) or "—"]),
        ("torch import", [torch]),
    ]
    lines = [f"{d['op']} ({d['family']})"]
    if d["doc"]:
        lines.append(f"  {d['doc']}")
    lines.append("")
    for title, values in rows:
        lines += [f"{title if k == 0 else '':<13}{v}" for k, v in enumerate(values)]
    rule = d["rule"]
    if rule is not None:
        ex = rule["example"]
        given = ", ".join([f"{n}: {t}" for n, t in ex["operands"].items()] +
                          [f"{k}={v!r}" for k, v in ex["attrs"].items()])
        lines += ["", f"compute rule, on the first catalogue example ({given} -> {ex['result']}):"]
        lines += [f"  {line}" for line in rule["text"].splitlines()]
    return "\n".join(lines) + "\n"


def cmd_ops(args: argparse.Namespace) -> int:
    if args.name is not None:
        if args.format == "markdown":
            raise UsageError("`cuvil ops NAME` prints text or json", location="--format",
                             hint="drop --format markdown, or use --format json")
        detail = op_detail(args.name)
        sys.stdout.write(json.dumps(detail, indent=2) + "\n" if args.format == "json" else detail_text(detail))
        return EXIT_OK
    table = compatibility_table()
    if args.format == "json":
        sys.stdout.write(json.dumps(table, indent=2) + "\n")
        return EXIT_OK
    if args.format == "markdown":
        sys.stdout.write("## CIR ops\n\n" + _markdown(table["ops"], OP_COLUMNS) + "\n\n")
        sys.stdout.write("## ONNX ops\n\n" + _markdown(table["onnx"], ONNX_COLUMNS) + "\n")
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for title, rows, columns in (("CIR ops", table["ops"], OP_COLUMNS), ("ONNX ops", table["onnx"], ONNX_COLUMNS)):
        t = Table(title=f"{title} ({len(rows)})")
        for key, name in columns:
            t.add_column(name, no_wrap=key not in ("onnx", "torch", "llvm", "cir_ops"))
        for r in rows:
            t.add_row(*(str(r[k]) for k, _ in columns))
        console.print(t)
    return EXIT_OK


def register(sub: Any) -> None:
    p = sub.add_parser("ops", help="the compatibility table: CIR ops, their frontends and readers",
                       epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", nargs="?", metavar="NAME",
                   help="one op in detail: signature, properties, support, and its compute rule")
    p.add_argument("--format", choices=("table", "markdown", "json"), default="table",
                   help="with NAME: table (text) or json")
    p.set_defaults(handler=cmd_ops)
