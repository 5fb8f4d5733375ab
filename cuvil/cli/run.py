"""``cuvil run``: a compiled library run on .npy inputs. It loads the library through the manifest
beside it (the library's hash and the sealed manifest checked first), so it needs neither the
model nor any framework."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.cli.common import EXIT_CODES, EXIT_OK, check_output, file_name, read_bindings
from cuvil.errors import InputError


def summarize(name: str, a: np.ndarray, first: int) -> str:
    """One line: name, dtype and shape, min/max/mean over finite values, and the first elements."""
    head = f"{name}: {a.dtype}[{', '.join(map(str, a.shape))}]"
    if a.size == 0:
        return head + "  (empty)"
    flat = a.reshape(-1)
    try:
        values: np.ndarray | None = flat.astype(np.float64)
    except (TypeError, ValueError):
        values = None
    parts = [head]
    if values is not None:
        finite = values[np.isfinite(values)]
        if finite.size:
            parts.append(f"min={finite.min():.6g} max={finite.max():.6g} mean={finite.mean():.6g}")
        bad = values.size - finite.size
        if bad:
            parts.append(f"non-finite={bad}")
    shown = ", ".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in flat[:first].tolist())
    more = ", ..." if flat.size > first else ""
    parts.append(f"first=[{shown}{more}]")
    return "  ".join(parts)


def _require_proof(library: Path, manifest: Mapping[str, Any]) -> None:
    """Refuse to run a library unless every pass application it kept was proved. The manifest's
    certificate is sealed into the library (the loader checked the seal), so it can be read as is."""
    from verify.certificate import kept_unproved
    from verify.errors import ProofFailure, ProofIncomplete

    cert = manifest.get("verification")
    if not isinstance(cert, dict):
        raise ProofIncomplete(f"{library.name} carries no certificate: nothing was proved about it",
                              location=str(library), hint="compile it with --gate (or --verify)")
    unproved = kept_unproved(cert)
    if unproved:
        listed = "; ".join(f"{o.get('pass')} at @{o.get('function')}:{o.get('output')} ({o.get('verdict')})"
                           for o in unproved[:5])
        kind = ProofFailure if any(o.get("verdict") == "refuted" for o in unproved) else ProofIncomplete
        raise kind(f"{library.name} was compiled with {len(unproved)} unproved pass application(s): {listed}",
                   location=str(library), hint="recompile with --gate, which stops or rolls back unproved passes")
    sys.stderr.write(f"proof: {library.name}: every kept pass application proved "
                     f"({cert.get('summary', {}).get('proved', 0)} obligations)\n")


def _profile(model: Any, inputs: Mapping[str, np.ndarray] | list[np.ndarray], runs: int) -> None:
    """Run ``runs`` more times after the first (warm) run and print where the time went, per op."""
    from cuvil.runtime.profile import render_profile

    model.profile(reset=True)  # raises a clear error for a library built without --profile
    start = time.perf_counter()
    for _ in range(runs):
        model.run(inputs)
    wall = (time.perf_counter() - start) / runs
    sys.stdout.write(render_profile(model.profile(), top=20) + "\n")
    sys.stdout.write(f"{wall * 1e3:.3f} ms a call from Python (the argument checks and the output arrays "
                     "included)\n")


def cmd_run(args: argparse.Namespace) -> int:
    from cuvil.runtime.loader import load

    check_output(args.output_dir, "--output-dir", folder=True)
    library = Path(args.library)
    if not library.is_file():
        raise InputError(f"library {library} does not exist", location=str(library),
                         hint="compile one with `cuvil compile --input MODEL --output libmodel.so`")
    model = load(library)
    if args.require_proof:
        _require_proof(library, model.manifest or {})
    named, positional = read_bindings(args.input, "--input")
    if args.cast:
        specs = {s.name: s for s in model.inputs}
        named = {k: (v.astype(specs[k].dtype.np) if k in specs else v) for k, v in named.items()}
        positional = [v.astype(s.dtype.np) for v, s in zip(positional, model.inputs, strict=False)] + \
            positional[len(model.inputs):]
    inputs: Mapping[str, np.ndarray] | list[np.ndarray] = named if named or not positional else positional
    if args.profile is not None and args.profile < 1:
        raise InputError(f"--profile takes a number of runs of at least 1, got {args.profile}", location="--profile")
    start = time.perf_counter()
    outputs = model.run(inputs)
    seconds = time.perf_counter() - start
    if args.profile is not None:
        _profile(model, inputs, args.profile)
    out_dir = Path(args.output_dir) if args.output_dir else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    used: set[str] = set()
    for k, (spec, arr) in enumerate(zip(model.outputs, outputs, strict=True)):
        sys.stdout.write(summarize(spec.name, arr, args.first) + "\n")
        if out_dir is None:
            continue
        stem = file_name(spec.name)
        stem = stem if stem not in used else f"{stem}_{k}"
        used.add(stem)
        np.save(out_dir / f"{stem}.npy", arr, allow_pickle=False)
    sys.stderr.write(f"ran {library.name} in {seconds * 1e3:.2f} ms\n")
    if out_dir is not None:
        sys.stderr.write(f"saved {len(outputs)} output(s) to {out_dir}\n")
    return EXIT_OK


def register(sub: Any) -> None:
    """Add ``run`` to the ``cuvil`` command's subparsers."""
    p = sub.add_parser("run", help="run a compiled library on .npy inputs and print output summaries",
                       epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("library", help="a library written by `cuvil compile` (its .json manifest beside it)")
    p.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input array (NAME=FILE.npy, FILE.npz with named arrays, or FILE.npy in "
                        "parameter order); repeatable")
    p.add_argument("--output-dir", "-o", metavar="DIR", help="also save each output as DIR/<name>.npy")
    p.add_argument("--cast", action="store_true", help="convert inputs to the library's dtypes first")
    p.add_argument("--require-proof", action="store_true",
                   help="run only if the library's sealed certificate proves every pass application it kept "
                        "(exit 1 when one was refuted, 3 when one is unproved or there is no certificate)")
    p.add_argument("--first", type=int, default=8, metavar="K", help="how many leading values to print")
    p.add_argument("--profile", type=int, default=None, metavar="N",
                   help="after the first run, run N more times and print the time each op took (a library "
                        "compiled with `cuvil compile --profile`)")
    p.set_defaults(handler=cmd_run)
