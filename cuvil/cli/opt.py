"""``cuvil opt``: run a pass pipeline over a model and print or save the optimized CIR."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rich.console import Console
from rich.table import Column, Table

from cuvil.cli.common import EXIT_CODES, EXIT_OK, check_output, import_model_file
from cuvil.errors import InputError


def cmd_opt(args: argparse.Namespace) -> int:
    from cuvil.ir.printer import export_ir, print_module
    from cuvil.passes import PassManager, parse_pipeline
    from cuvil.passes.base import PASS_REGISTRY

    if args.list_passes:
        parse_pipeline("O0")  # registers the built-in passes
        table = Table("pass", "contract", "what it does")
        for name, cls in sorted(PASS_REGISTRY.items()):
            table.add_row(name, str(cls.contract), cls.description)
        Console().print(table)
        return EXIT_OK
    if not args.model:
        raise SystemExit("cuvil opt: a MODEL is required (or --list-passes)")
    check_output(args.output, "--output")
    passes = parse_pipeline(args.pipeline)
    unknown = sorted(set(args.print_after) - {p.name for p in passes} - {"all"})
    if unknown:
        raise InputError(f"--print-after names passes the pipeline does not run: {', '.join(unknown)}",
                         location="--print-after", hint="passes in it: " + ", ".join(p.name for p in passes))
    module = import_model_file(args.model)
    manager = PassManager(passes, print_after=args.print_after,
                          printer=lambda text: print(text, file=sys.stderr))
    result = manager.run(module)
    if args.timing:
        table = Table("contract", "changed", "ops before", "ops after", "seconds", "notes")
        table.columns.insert(0, Column("pass", no_wrap=True))
        for r in result.records:
            table.add_row(r.name, str(r.contract), "yes" if r.changed else "no", str(r.ops_before),
                          str(r.ops_after), f"{r.seconds:.4f}", "; ".join(r.notes[:3]))
        Console(stderr=True).print(table)
    if args.output:
        export_ir(result.module, args.output)
        sys.stderr.write(f"wrote {args.output}\n")
    else:
        sys.stdout.write(print_module(result.module))
    return EXIT_OK


def register(sub: Any) -> None:
    p = sub.add_parser("opt", help="run a pass pipeline and print the optimized CIR", epilog=EXIT_CODES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", help="a model: .onnx, .pt2 or .cir")
    p.add_argument("-p", "--pipeline", default="O3",
                   help="O0..O3 or a comma-separated list of passes (default: O3)")
    p.add_argument("--print-after", action="append", default=[], metavar="PASS",
                   help="print the IR after this pass to stderr (repeatable; 'all' for every pass)")
    p.add_argument("-o", "--output", metavar="OUT.cir", help="write the optimized CIR here instead of stdout")
    p.add_argument("--timing", action="store_true", help="print a table of passes with op counts and times")
    p.add_argument("--list-passes", action="store_true", help="list the registered passes and exit")
    p.set_defaults(handler=cmd_opt)
