"""``cuvil probe``: where an FP16/BF16/INT8 version of a model can overflow or saturate."""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cuvil.cli.common import EXIT_CODES as COMMON_EXIT_CODES
from cuvil.cli.common import (
    add_report_arguments,
    calibration_ranges,
    check_output,
    check_report_outputs,
    check_seconds,
    import_model_file,
    parse_range,
    write_reports,
)
from cuvil.errors import InputError

EXIT_CODES = COMMON_EXIT_CODES + """
probe: 0 every site proved safe for the declared ranges; 1 an overflow or
saturation confirmed (a witness replayed on the reduced-precision program);
3 sites remain open
"""

def _hash(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def _specialize(module: Any, dims: Mapping[str, int]) -> Any:
    """Static shapes (symbolic dims bound by --dim, others to 1)."""
    from cuvil.ir.module import Module
    from cuvil.ir.specialize import specialize_function
    from cuvil.ir.symbolic import evaluate_dim

    fn = module.main
    symbols = fn.symbols()
    if not symbols:
        return module
    env = {s: int(dims.get(s, 1)) for s in symbols}
    shapes = {p.name: tuple(int(evaluate_dim(d, env)) for d in p.shape) for p in fn.params}
    spec, _ = specialize_function(fn, input_shapes=shapes)
    return Module((spec,), module.constants, module.metadata)


def cmd_probe(args: argparse.Namespace) -> int:
    from cuvil import __version__
    from reports import render_terminal
    from verify.probe.budget import DEFAULT_EFFORT
    from verify.probe.names import onnx_node_names
    from verify.probe.probe import ProbeOptions, probe, save_witnesses
    from verify.probe.report import to_report

    check_seconds(args.time_limit, "--time-limit")
    effort = DEFAULT_EFFORT if args.effort is None else args.effort
    if not math.isfinite(effort) or effort <= 0:
        raise InputError(f"--effort must be a positive number of work units, got {effort}", location="--effort",
                         hint=f"e.g. --effort {DEFAULT_EFFORT:g} (the default)")
    check_report_outputs(args)
    check_output(args.witness_dir, "--witness-dir", folder=True)
    if args.keep_fp32 not in ("none", "default", ""):
        from verify.probe.program import _keep_list

        _keep_list(args.keep_fp32)  # an unknown op is a usage error before any work
    dims: dict[str, int] = {}
    for spec in args.dim:
        name, _, value = spec.partition("=")
        if not name or not value.strip().isdigit():
            raise InputError(f"--dim {spec!r} is malformed", hint="write --dim NAME=VALUE, e.g. --dim batch=1")
        dims[name.strip()] = int(value)
    module = _specialize(import_model_file(args.model, args.static_input, dims=dims), dims)
    names = [p.name for p in module.main.params]
    ranges: dict[str, tuple[float, float]] = {}
    if args.calibrate:
        ranges.update(calibration_ranges(args.calibrate, names))
    given: set[str] = set()
    for spec in args.range:
        name, r = parse_range(spec)
        if name not in names:
            raise InputError(f"--range names {name!r}, which is not an input of the model",
                             hint="inputs: " + ", ".join(names))
        if name in given:
            raise InputError(f"--range gives {name!r} twice", location="--range", hint="one range per input")
        given.add(name)
        dtype = next(p.dtype for p in module.main.params if p.name == name)
        if not dtype.is_float and (r[0] < dtype.min_value or r[1] > dtype.max_value):
            raise InputError(f"--range {spec!r} leaves {name}'s type {dtype} ([{dtype.min_value}, "
                             f"{dtype.max_value}])", location="--range", hint="give a range the input can hold")
        ranges[name] = r
    missing = [n for n in names if n not in ranges]
    if missing:
        raise InputError(f"no range for input(s) {', '.join(missing)}",
                         hint="give --range NAME=LO:HI for each input, or --calibrate DIR")
    options = ProbeOptions(precision=args.precision, keep_ops=args.keep_fp32, effort=effort,
                           time_limit=args.time_limit,
                           boundary=not args.no_boundary, seed=args.seed, z3_witness=not args.no_z3_witness)
    node_names = onnx_node_names(args.model) if str(args.model).endswith(".onnx") else {}
    rep = probe(module, ranges, options, names=node_names)
    files: list[dict[str, str]] = []
    if rep.witnesses:
        folder = Path(args.witness_dir) if args.witness_dir else Path(f"{Path(args.model).stem}-witnesses")
        files = save_witnesses(rep, folder)
    settings = {"keep_fp32": args.keep_fp32, "effort_units": effort, "time_limit_s": args.time_limit,
                "command_line": " ".join(["cuvil", *sys.argv[1:]]) if sys.argv else "cuvil probe"}
    report = to_report(rep, model=str(args.model), model_hash=_hash(args.model), settings=settings,
                       witness_files=files, version=__version__)
    write_reports(report, args)
    if not args.quiet:
        render_terminal(report)
        for k, f in enumerate(files):
            sys.stdout.write(f"witness w{k + 1}: " + ", ".join(f"{n}={p}" for n, p in f.items()) + "\n")
    return rep.exit_code


def register(sub: Any) -> None:
    """Add ``probe`` to the ``cuvil`` command's subparsers."""
    p = sub.add_parser("probe", help="find where an FP16/BF16/INT8 version of a model can overflow, with proofs "
                                     "and witness inputs", epilog=EXIT_CODES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a model: .onnx, .pt2 or .cir")
    p.add_argument("--precision", choices=("fp16", "bf16", "int8"), default="fp16",
                   help="the reduced-precision program to probe (int8: the INT8 lowering of a QDQ model)")
    p.add_argument("--range", action="append", default=[], metavar="NAME=LO:HI",
                   help="the declared range of an input (every element in [LO, HI]); repeatable")
    p.add_argument("--calibrate", metavar="DIR", help="take missing ranges from .npy/.npz samples in DIR "
                                                      "(NAME.npy, NAME_*.npy, or .npz with named arrays)")
    add_report_arguments(p)
    p.add_argument("--witness-dir", metavar="DIR", help="where witnesses go (DIR/wN/<input>.npy; default "
                                                        "./<model>-witnesses)")
    p.add_argument("--keep-fp32", default="none", metavar="OPS",
                   help="ops kept in float32 in the probed program: 'none' (default: probe everything in the "
                        "narrow type), 'default' (the compiler's list) or a comma-separated list")
    p.add_argument("--effort", type=float, metavar="UNITS",
                   help="work the probe may do, in units of a million element operations (default: the probe's "
                        "standard budget, under a minute for the zoo on two cores; the report's settings give "
                        "it): the same effort gives the same report on any machine")
    p.add_argument("--time-limit", type=float, default=600.0, metavar="S",
                   help="outer wall-clock guard for the whole probe (default 600); the report names any phase it "
                        "cut, and only then may two runs differ")
    p.add_argument("--no-boundary", action="store_true", help="skip the boundary-scale search")
    p.add_argument("--seed", type=int, default=0, help="seed of the witness search")
    p.add_argument("--no-z3-witness", action="store_true",
                   help="skip the z3 witness search on sites with small cones (after the gradient search)")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE",
                   help="bind a symbolic dim (others are bound to 1)")
    p.add_argument("--static-input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="bind a graph input to a compile-time value; repeatable")
    p.add_argument("-q", "--quiet", action="store_true", help="no terminal summary")
    p.set_defaults(handler=cmd_probe)
