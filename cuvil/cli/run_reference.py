"""``cuvil run-reference``: a model run on the reference interpreter (the semantics every other
reading of the model is checked against)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.cli.common import (
    EXIT_CODES,
    EXIT_OK,
    MODEL_HELP,
    STATIC_HELP,
    check_output,
    file_name,
    import_model_file,
    read_bindings,
)


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


def register(sub: Any) -> None:
    p = sub.add_parser("run-reference", help="run a model on the reference interpreter", epilog=EXIT_CODES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input array (NAME=FILE.npy, FILE.npz with named arrays, or FILE.npy in "
                        "parameter order); repeatable")
    p.add_argument("--output-dir", "-o", metavar="DIR", help="also save each output as DIR/<name>.npy")
    p.add_argument("--function", metavar="NAME", help="the function to run (default: main)")
    p.add_argument("--threshold", type=int, default=100, help="print arrays with more elements in summary")
    p.add_argument("--static-input", action="append", default=[], metavar="NAME=FILE.npy", help=STATIC_HELP)
    p.set_defaults(handler=cmd_run_reference)
