"""The ``cuvil`` command.

Every table it prints is generated from the registries (op catalogue, frontend
converters, reader registries), so the compatibility list cannot drift from the code.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.cli_common import (
    EXIT_CODES,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    ArgumentParser,
    check_output,
    exit_for,
    file_name,
    import_model_file,
    io_error,
    read_bindings,
    report_error,
)
from cuvil.errors import CuvilError

NOT_YET = "not yet"
TORCH_MISSING = "torch not installed"

# Commands other packages of the distribution contribute: each module has `register(subparsers)`.
COMMAND_MODULES = ("cuvil.cli_opt", "verify.probe.cli", "verify.cli")

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


# --------------------------------------------------------------------------------------
# models and inputs


def cmd_ir(args: argparse.Namespace) -> int:
    from cuvil.ir.printer import export_ir, print_module
    from cuvil.ir.wellformed import check_module

    check_output(args.output, "--output")
    module = import_model_file(args.model, args.static_input)
    check_module(module)
    if args.output:
        export_ir(module, args.output)
        sys.stderr.write(f"wrote {args.output}\n")
    else:
        sys.stdout.write(print_module(module))
    return EXIT_OK


def cmd_run_reference(args: argparse.Namespace) -> int:
    from cuvil.interp import run_reference

    check_output(args.output_dir, "--output-dir", folder=True)
    module = import_model_file(args.model, args.static_input)
    fn = module.function(args.function) if args.function else module.main
    named, positional = read_bindings(args.input, "--input")
    inputs: Mapping[str, np.ndarray] | list[np.ndarray] = named if named or not positional else positional
    outputs = run_reference(module, inputs, function=fn.name)
    out_dir = Path(args.output_dir) if args.output_dir else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    used: set[str] = set()
    with np.printoptions(threshold=args.threshold, edgeitems=3):
        for k, (name, arr) in enumerate(zip(fn.result_names, outputs, strict=True)):
            sys.stdout.write(f"{name}: {arr.dtype}{list(arr.shape)}\n{arr}\n")
            if out_dir is None:
                continue
            stem = file_name(name)
            stem = stem if stem not in used else f"{stem}_{k}"  # names that sanitize alike stay apart
            used.add(stem)
            np.save(out_dir / f"{stem}.npy", arr, allow_pickle=False)
    if out_dir is not None:
        sys.stderr.write(f"saved {len(outputs)} output(s) to {out_dir}\n")
    return EXIT_OK


# --------------------------------------------------------------------------------------
# entry point


def build_parser() -> argparse.ArgumentParser:
    from cuvil import __version__

    parser = ArgumentParser(
        prog="cuvil", description="Cuvil: an inference compiler for PyTorch/ONNX models that proves its "
                                  "optimizations.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"cuvil {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log each stage with its time")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("ops", help="the compatibility table: CIR ops, their frontends and readers",
                       epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--format", choices=("table", "markdown", "json"), default="table")
    p.set_defaults(handler=cmd_ops)

    model_help = "a model: .onnx, .pt2 or .cir"
    static_help = "bind a graph input to a compile-time value (for inputs used as shapes); repeatable"
    p = sub.add_parser("ir", help="print a model's CIR", epilog=EXIT_CODES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help=model_help)
    p.add_argument("-o", "--output", metavar="OUT.cir", help="write the CIR to a file instead of stdout")
    p.add_argument("--static-input", action="append", default=[], metavar="NAME=FILE.npy", help=static_help)
    p.set_defaults(handler=cmd_ir)

    p = sub.add_parser("run-reference", help="run a model on the reference interpreter", epilog=EXIT_CODES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help=model_help)
    p.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input array (NAME=FILE.npy, FILE.npz with named arrays, or FILE.npy in "
                        "parameter order); repeatable")
    p.add_argument("--output-dir", "-o", metavar="DIR", help="also save each output as DIR/<name>.npy")
    p.add_argument("--function", metavar="NAME", help="the function to run (default: main)")
    p.add_argument("--threshold", type=int, default=100, help="print arrays with more elements in summary")
    p.add_argument("--static-input", action="append", default=[], metavar="NAME=FILE.npy", help=static_help)
    p.set_defaults(handler=cmd_run_reference)

    from cuvil.cli_compile import add_subcommands as add_compile_subcommands

    add_compile_subcommands(sub)
    for name in COMMAND_MODULES:
        if importlib.util.find_spec(name.rpartition(".")[0]) is not None:
            importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verbose:
        from cuvil.log import set_log_level

        set_log_level("DEBUG")
    try:
        return int(args.handler(args))
    except CuvilError as e:
        report_error(e)
        return exit_for(e)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK
    except OSError as e:  # the environment refused a file: a missing folder, a directory, no permission, no space
        report_error(io_error(e))
        return EXIT_USAGE
    except Exception as e:  # a bug in cuvil: its own exit code, never a verdict's
        if args.verbose:
            traceback.print_exc()
        where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
        at = f" at {Path(where.filename).name}:{where.lineno}" if where else ""
        sys.stderr.write(f"internal error[CUVIL-INTERNAL]: {type(e).__name__}: {e}{at}\n"
                         f"  hint: this is a bug in cuvil; please report it with the command and the model "
                         f"(run with -v for the traceback)\n")
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
