"""``cuvil ir``: a model's CIR, printed or written to a ``.cir`` file."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cuvil.cli.common import EXIT_CODES, EXIT_OK, MODEL_HELP, STATIC_HELP, check_output, import_model_file


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


def register(sub: Any) -> None:
    p = sub.add_parser("ir", help="print a model's CIR", epilog=EXIT_CODES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument("-o", "--output", metavar="OUT.cir", help="write the CIR to a file instead of stdout")
    p.add_argument("--static-input", action="append", default=[], metavar="NAME=FILE.npy", help=STATIC_HELP)
    p.set_defaults(handler=cmd_ir)
