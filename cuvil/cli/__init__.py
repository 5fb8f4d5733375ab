"""The ``cuvil`` command: one module per subcommand, parsing shared in :mod:`cuvil.cli.common`.

The commands sit above everything else (compile orchestration, the verifier, the prober): they
parse, call the library, print, and map the outcome to an exit code. They never import each
other.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from cuvil.cli.common import (
    EXIT_CODES,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    ArgumentParser,
    exit_for,
    io_error,
    report_error,
)
from cuvil.errors import CuvilError

COMMANDS = ("ops", "ir", "run_reference", "opt", "compile", "run", "verify", "probe", "lora", "failsafe")
"""The subcommand modules of this package, in the order ``cuvil --help`` lists them."""
NEEDS_VERIFIER = ("verify", "probe", "lora", "failsafe")


def build_parser() -> ArgumentParser:
    import argparse

    from cuvil import __version__

    parser = ArgumentParser(
        prog="cuvil", description="Cuvil: an inference compiler for PyTorch/ONNX models that proves its "
                                  "optimizations.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"cuvil {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log each stage with its time")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    verifier = importlib.util.find_spec("verify") is not None
    for name in COMMANDS:
        if name in NEEDS_VERIFIER and not verifier:
            continue
        importlib.import_module(f"cuvil.cli.{name}").register(sub)
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
