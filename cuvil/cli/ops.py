"""``cuvil ops``: the compatibility table, generated from the registries (op catalogue, frontend
converters, the readers of the compute rules), so the list cannot drift from the code."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from cuvil.cli.common import EXIT_CODES, EXIT_OK

NOT_YET = "not yet"
TORCH_MISSING = "torch not installed"

# Later readers of the compute rules publish which ops they handle as
# `supported_ops() -> Mapping[op, note] | Iterable[op]` (or a SUPPORTED_OPS constant).
READERS = {"z3": ("verify.encode",), "llvm": ("cuvil.codegen", "cuvil.codegen.lower")}


# --------------------------------------------------------------------------------------
# the compatibility table


def _reader_support(modules: Sequence[str]) -> Callable[[str], str] | None:
    """A cell function for a reader, or None when no module publishes its supported ops."""
    for name in modules:
        try:
            if importlib.util.find_spec(name) is None:
                continue
            mod = importlib.import_module(name)
        except Exception:  # a reader that cannot be imported is not available yet
            continue
        source = getattr(mod, "supported_ops", None)
        try:
            table = source() if callable(source) else getattr(mod, "SUPPORTED_OPS", None)
        except Exception:
            continue
        if table is None:
            continue
        if isinstance(table, Mapping):
            notes = {str(k): str(v) for k, v in table.items()}
            return lambda op: notes.get(op, "no")
        names = {str(x) for x in table}
        return lambda op: "yes" if op in names else "no"
    return None


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
    items: Iterable[tuple[Any, Any]] = table.items() if isinstance(table, Mapping) else ((None, e) for e in table)
    by_op: dict[str, list[str]] = {}
    for key, entry in items:
        label = str(getattr(entry, "op_type", None) or (key[-1] if isinstance(key, tuple) else key))
        for op in getattr(entry, "cir_ops", ()):
            by_op.setdefault(op, []).append(label)
    return {k: sorted(set(v)) for k, v in by_op.items()}


def compatibility_table() -> dict[str, Any]:
    """One row per catalogue op (which frontends produce it, which readers handle it),
    plus one row per ONNX op type with its CIR lowering."""
    from cuvil.ir.opdef import all_ops

    onnx_by_op, onnx_rows = _onnx_sources()
    torch_by_op = _torch_sources()
    readers = {name: _reader_support(mods) for name, mods in READERS.items()}
    rows = []
    for op in all_ops():
        torch_cell = torch_by_op if isinstance(torch_by_op, str) else ", ".join(torch_by_op.get(op.name, [])) or "—"
        rows.append({
            "op": op.name,
            "family": op.family,
            "onnx": ", ".join(onnx_by_op.get(op.name, [])) or "—",
            "torch": torch_cell,
            "interpreter": "rule + fast path" if op.numpy is not None else "rule only",
            "z3": readers["z3"](op.name) if readers["z3"] else NOT_YET,
            "llvm": readers["llvm"](op.name) if readers["llvm"] else NOT_YET,
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


def cmd_ops(args: argparse.Namespace) -> int:
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
            t.add_column(name, no_wrap=key not in ("onnx", "torch", "cir_ops"))
        for r in rows:
            t.add_row(*(str(r[k]) for k, _ in columns))
        console.print(t)
    return EXIT_OK


def register(sub: Any) -> None:
    p = sub.add_parser("ops", help="the compatibility table: CIR ops, their frontends and readers",
                       epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--format", choices=("table", "markdown", "json"), default="table")
    p.set_defaults(handler=cmd_ops)
