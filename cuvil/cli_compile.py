"""``cuvil compile`` and ``cuvil run``: a model file to a native library, and a library run on .npy inputs.

``compile`` writes three files side by side: the library (``--output``, default
``lib<model>.so``), its C header (``<stem>.h``) and its JSON manifest (``<stem>.json``),
where ``<stem>`` is the library's file name without ``lib`` and ``.so``. ``run`` loads a
library through the manifest beside it (checking the library's hash first), so it needs
neither the model nor any framework.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.cli_common import (
    EXIT_CODES,
    EXIT_OK,
    VERDICT_EXITS,
    check_output,
    exit_for,
    file_name,
    read_bindings,
    report_error,
)
from cuvil.errors import CodegenError, CuvilError, InputError, ModelLoadError

OPT_LEVELS = {"O0": 0, "O1": 1, "O2": 2, "O3": 3}
COMPILE_EXIT_CODES = EXIT_CODES + """
a gated compile that stops writes nothing (with --enable-fp16, an op whose
float16 sites are not proved safe for the --range box stops it too)
"""
MODEL_SUFFIXES = (".onnx", ".pt2", ".cir")
_DIMS = re.compile(r"^\d+(?:[x,]\d+)*$|^$")


# --------------------------------------------------------------------------------------
# argument parsing


def parse_opt_level(text: str) -> int:
    key = text.strip().upper()
    key = key if key.startswith("O") else f"O{key}"
    if key not in OPT_LEVELS:
        raise InputError(f"--opt-level {text!r} is not one of O0, O1, O2, O3", location="--opt-level")
    return OPT_LEVELS[key]


def parse_shapes(specs: list[str]) -> dict[str, tuple[int, ...]]:
    """``NAME=2x3x224x224`` (or ``NAME=2,3,224,224``; ``NAME=`` for a scalar) per input."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, eq, dims = spec.rpartition("=")  # input names may hold "=", dims never do
        dims = dims.strip().lower()
        if not eq or not name or not _DIMS.match(dims):
            raise InputError(f"--shape {spec!r} is malformed", location="--shape",
                             hint="write --shape NAME=2x3x224x224 (dims separated by x), one per input")
        if name in shapes:
            raise InputError(f"--shape gives input {name!r} twice", location="--shape")
        shapes[name] = tuple(int(d) for d in re.split(r"[x,]", dims)) if dims else ()
    return shapes


def _output_names(output: Path) -> tuple[Path, Path]:
    """The header and manifest paths beside ``output`` (``libmodel.so`` -> ``model.h``, ``model.json``)."""
    stem = output.name.removesuffix(".so")
    if stem.startswith("lib") and len(stem) > 3:
        stem = stem[3:]
    return output.with_name(stem + ".h"), output.with_name(stem + ".json")


def _symbol_name(model: Path) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", model.stem) or "model"


# --------------------------------------------------------------------------------------
# compile


def _install(library: Path, manifest: Mapping[str, Any], output: Path) -> tuple[Path, Path]:
    """Copy the library and header next to ``output`` under their new names, and write the
    manifest naming them (each file written atomically)."""
    from cuvil.codegen.artifact import file_sha256

    header_out, manifest_out = _output_names(output)
    if output in (header_out, manifest_out):
        raise InputError(f"--output {output} would be overwritten by its own header or manifest",
                         location="--output", hint="name the library like libmodel.so")
    output.parent.mkdir(parents=True, exist_ok=True)
    header_src = library.parent / str(manifest["header"])

    def place(src: Path, dst: Path) -> None:
        staged = dst.with_name(f".{dst.name}.{uuid.uuid4().hex}.tmp")
        shutil.copy(src, staged)
        os.replace(staged, dst)

    place(library, output)
    if file_sha256(output) != manifest["library_sha256"]:
        raise CodegenError(f"{output} does not match the library that was compiled", location=str(output),
                           hint="another process is writing to the same output path")
    place(header_src, header_out)
    placed = dict(manifest, library=output.name, header=header_out.name)
    staged = manifest_out.with_name(f".{manifest_out.name}.{uuid.uuid4().hex}.tmp")
    staged.write_text(json.dumps(placed, indent=2) + "\n")
    os.replace(staged, manifest_out)
    return header_out, manifest_out


def cmd_compile(args: argparse.Namespace) -> int:
    from cuvil.compiler import compile as compile_model

    source = args.input or args.model
    if not source:
        raise InputError("no model given", hint="cuvil compile --input model.onnx|model.pt2|model.cir")
    model_path = Path(source)
    if not model_path.is_file():
        raise ModelLoadError(f"model file {model_path} does not exist", location=str(model_path))
    if model_path.suffix.lower() not in MODEL_SUFFIXES:
        raise ModelLoadError(f"{model_path.name}: unknown model format {model_path.suffix!r}",
                             location=str(model_path), hint="give a .onnx, .pt2 or .cir file")
    opt_level = parse_opt_level(args.opt_level)
    shapes = parse_shapes(args.shape)
    if args.threads is not None and args.threads < 1:
        raise InputError(f"--threads must be at least 1, got {args.threads}", location="--threads")
    output = check_output(args.output or str(Path.cwd() / f"lib{model_path.stem}.so"), "--output", suffix=".so")
    assert output is not None
    options: dict[str, Any] = {}
    if args.static_input:
        named, positional = read_bindings(args.static_input, "--static-input")
        if positional:
            raise InputError("--static-input values must be named", hint="write --static-input NAME=FILE.npy")
        options["static_inputs"] = named
    options.update(_fp16_options(args, model_path, options))
    gate = _make_gate(args)
    passes: Any = args.passes
    from cuvil.plugins import plugins_from_args, resolve_pipeline

    plugins = plugins_from_args(args)
    if plugins:
        passes = resolve_pipeline(args.passes, plugins, default=f"O{opt_level}")
    staging: Path | None = None
    if args.no_cache:
        output.parent.mkdir(parents=True, exist_ok=True)
        staging = output.parent / f".cuvil-build-{uuid.uuid4().hex}"
    start = time.perf_counter()
    try:
        model = compile_model(model_path, target=args.target, opt_level=opt_level, threads=args.threads,
                              input_shapes=shapes or None, passes=passes, gate=gate, name=args.name or
                              _symbol_name(model_path), cache=not args.no_cache, output_dir=staging,
                              dynamic=False, **options)
        assert model.library_path is not None and model.manifest is not None
        header, manifest_path = _install(model.library_path, model.manifest, output)
    except CuvilError as e:
        if e.code not in VERDICT_EXITS or gate is None:
            raise
        report_error(e)
        sys.stderr.write(f"no library written: the gate stopped code generation ({output} left as it was)\n")
        return exit_for(e)
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    seconds = time.perf_counter() - start
    man = model.manifest
    size = output.stat().st_size
    status = model.cache_info.get("cache", "off")
    out = sys.stdout
    out.write(f"compiled {model_path} -> {output} ({size / 1e6:.2f} MB, cache {status}) in {seconds:.2f} s\n")
    out.write(f"  header    {header}\n  manifest  {manifest_path}\n")
    out.write(f"  target    {man['target']['triple']} (CPU {man['target']['cpu']}), O{man['opt_level']}\n")
    for kind in ("inputs", "outputs"):
        for k, e in enumerate(man[kind]):
            label = kind if k == 0 else ""
            out.write(f"  {label:<9} {e['name']}: {e['dtype']}[{', '.join(map(str, e['shape']))}]\n")
    if man.get("specialized_dims"):
        out.write("  dims      " + ", ".join(f"{k}={v}" for k, v in man["specialized_dims"].items()) + "\n")
    _print_verification(man.get("verification"))
    _print_precision(man.get("precision"))
    return EXIT_OK


def _make_gate(args: argparse.Namespace) -> Any:
    """The verifier's gate for --verify (audit: record, keep everything) or --gate (strict/degrade)."""
    gated = args.gate or args.on_proof_failure is not None
    if not (args.verify or gated):
        return None
    if args.verify and gated:
        raise InputError("--verify records proofs without stopping; --gate stops on them: give one",
                         location="--verify")
    if importlib.util.find_spec("verify") is None:
        raise InputError("the verifier is not installed", location="--gate" if gated else "--verify",
                         hint="install cuvil with its verifier (z3-solver)")
    from verify.gate import make_gate

    policy = "audit" if args.verify else (args.on_proof_failure or "strict")
    return make_gate(policy, roll_back_refuted=policy == "degrade")


def _fp16_options(args: argparse.Namespace, model_path: Path, options: Mapping[str, Any]) -> dict[str, Any]:
    """``fp16``/``ranges`` for compile() from --enable-fp16, --range and --calibrate (empty without FP16)."""
    if not args.enable_fp16:
        if args.range or args.calibrate:
            raise InputError("--range and --calibrate declare input ranges for --enable-fp16", location="--range",
                             hint="add --enable-fp16, or drop them")
        return {}
    if importlib.util.find_spec("verify") is None:
        raise InputError("--enable-fp16 needs the overflow prober, which is not installed", location="--enable-fp16",
                         hint="install cuvil with its verifier")
    from verify.probe.cli import calibration_ranges, parse_range

    ranges: dict[str, tuple[float, float]] = {}
    if args.calibrate:
        from cuvil.frontend.dispatch import import_model

        names = [p.name for p in import_model(model_path, **options).main.params]
        ranges.update(calibration_ranges(args.calibrate, names))
    given: set[str] = set()
    for spec in args.range:
        name, r = parse_range(spec)
        if name in given:
            raise InputError(f"--range gives input {name!r} twice", location="--range")
        given.add(name)
        ranges[name] = r
    if not ranges:
        raise InputError("--enable-fp16 needs the declared range of every input: only ops proved safe for those "
                         "ranges run in float16", location="--enable-fp16",
                         hint="add --range NAME=LO:HI per input (e.g. --range x=-1:1; token ids: --range "
                              "input_ids=0:VOCAB-1), or --calibrate DIR of NAME.npy samples")
    return {"fp16": True, "ranges": ranges}


def _print_precision(entry: Any) -> None:
    if not isinstance(entry, dict):
        return
    sys.stdout.write(f"  fp16      {entry.get('fp16_ops')} ops in float16, {entry.get('fp32_ops')} kept float32 "
                     f"({entry.get('unproved')} not proved safe); `precision` in the manifest lists them\n")
    unproved = [k for k in entry.get("kept_fp32", []) if k.get("cause") != "type"]
    for k in unproved[:10]:
        sys.stdout.write(f"    {k.get('value')} {k.get('op')}: {k.get('reason')}\n")
    if len(unproved) > 10:
        sys.stdout.write(f"    ... and {len(unproved) - 10} more\n")


def _print_verification(cert: Any) -> None:
    if not isinstance(cert, dict):
        return
    s = cert.get("summary", {})
    sys.stdout.write(f"  verified  {s.get('obligations')} obligations ({cert.get('policy')}): {s.get('proved')} "
                     f"proved, {s.get('refuted')} refuted, {s.get('unknown')} unknown; certificate in the manifest\n")
    for r in cert.get("rollbacks", []):
        sys.stdout.write(f"  rolled back  {r.get('pass')}: {r.get('reason')}\n")
    kept = [o for a in cert.get("applications", []) if not a.get("rolled_back")
            for o in a.get("obligations", []) if o.get("verdict") != "proved"]
    if kept:
        sys.stderr.write(f"warning: the library includes {len(kept)} pass result(s) that were not proved "
                         f"(see `verification` in the manifest); compile with --gate to stop on them\n")


# --------------------------------------------------------------------------------------
# run


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
    start = time.perf_counter()
    outputs = model.run(inputs)
    seconds = time.perf_counter() - start
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


# --------------------------------------------------------------------------------------
# registration


def add_subcommands(sub: Any) -> None:
    from cuvil.plugins import add_plugin_arguments

    """Add ``compile`` and ``run`` to the ``cuvil`` command's subparsers."""
    p = sub.add_parser("compile", help="compile a model to a native shared library (+ C header, manifest)",
                       epilog=COMPILE_EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", help="the model (.onnx, .pt2 or .cir); or use --input")
    p.add_argument("--input", "-i", metavar="MODEL", help="the model: .onnx, .pt2 or .cir")
    p.add_argument("--output", "-o", metavar="LIB.so",
                   help="the library to write (default: lib<model>.so here); <stem>.h and <stem>.json go beside it")
    p.add_argument("--target", default=None, metavar="TRIPLE",
                   help="target triple (default: this machine; only the host target is supported)")
    p.add_argument("--opt-level", default="O3", metavar="O0..O3", help="optimization level (default O3)")
    p.add_argument("--passes", default=None, metavar="SPEC",
                   help="a pass pipeline instead of the opt level's (e.g. 'O2' or 'fold-batchnorm,dce')")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="threads the library may use")
    p.add_argument("--shape", action="append", default=[], metavar="NAME=2x3x224x224",
                   help="the shape of an input with symbolic dims; repeatable")
    p.add_argument("--name", default=None, help="the symbol prefix (cuvil_<name>_run...; default: the model's stem)")
    p.add_argument("--no-cache", action="store_true", help="compile from scratch, without reading or filling "
                                                            "the artifact cache")
    p.add_argument("--static-input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="bind a graph input to a compile-time value (for inputs used as shapes); repeatable")
    add_plugin_arguments(p)
    p.add_argument("--verify", action="store_true",
                   help="prove every pass application and embed the certificate in the manifest (never stops)")
    p.add_argument("--gate", action="store_true",
                   help="prove every pass application; a refuted or unproved one stops code generation")
    p.add_argument("--on-proof-failure", choices=("strict", "degrade"), default=None,
                   help="with --gate (implied): strict stops (default); degrade rolls the application back, "
                        "continues, and records the rollback in the certificate")
    p.add_argument("--enable-fp16", action="store_true",
                   help="run in float16 every op the overflow prober proves safe for the --range box; the rest "
                        "stays float32 (listed with the reason in the manifest's `precision`); with --gate, any "
                        "op not proved refuses the build")
    p.add_argument("--range", action="append", default=[], metavar="NAME=LO:HI",
                   help="with --enable-fp16: the declared range of an input (every element in [LO, HI]); one per "
                        "input, integer inputs such as token ids included; repeatable")
    p.add_argument("--calibrate", metavar="DIR",
                   help="with --enable-fp16: take the ranges not given by --range from .npy/.npz samples in DIR "
                        "(NAME.npy, NAME_*.npy, or .npz with named arrays)")
    p.set_defaults(handler=cmd_compile)

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
    p.set_defaults(handler=cmd_run)
