"""``cuvil compile``: a model file to a native library.

It writes three files side by side: the library (``--output``, default ``lib<model>.so``, or
``lib<model>.wasm`` for ``--target wasm32-wasi``), its C header (``<stem>.h``) and its JSON manifest
(``<stem>.json``), where ``<stem>`` is the library's file name without ``lib`` and ``.so``/``.wasm``.
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

from cuvil.cli.common import (
    EXIT_CODES,
    EXIT_OK,
    VERDICT_EXITS,
    add_plugin_arguments,
    calibration_ranges,
    check_output,
    exit_for,
    parse_dim_max,
    parse_dim_ranges,
    parse_opt_level,
    parse_range,
    parse_shapes,
    plugins_from_args,
    read_bindings,
    report_error,
)
from cuvil.codegen.shape_class import ShapeClass
from cuvil.errors import CodegenError, CuvilError, InputError, ModelLoadError, UsageError

COMPILE_EXIT_CODES = EXIT_CODES + """
a gated compile that stops writes nothing (with --enable-fp16, an op whose
float16 sites are not proved safe for the --range box stops it too)
"""
MODEL_SUFFIXES = (".onnx", ".pt2", ".cir")


# --------------------------------------------------------------------------------------
# argument parsing


def _output_names(output: Path) -> tuple[Path, Path]:
    """The header and manifest paths beside ``output`` (``libmodel.so`` or ``libmodel.wasm`` -> ``model.h``,
    ``model.json``)."""
    stem = output.name.removesuffix(".so").removesuffix(".wasm").removesuffix(".ptx")
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
    header_src = library.parent / str(manifest.get("header"))

    def place(src: Path, dst: Path) -> None:
        staged = dst.with_name(f".{dst.name}.{uuid.uuid4().hex}.tmp")
        shutil.copy(src, staged)
        os.replace(staged, dst)

    place(library, output)
    if file_sha256(output) != manifest["library_sha256"]:
        raise CodegenError(f"{output} does not match the library that was compiled", location=str(output),
                           hint="another process is writing to the same output path")
    placed = dict(manifest, library=output.name)
    if "header" in manifest:
        place(header_src, header_out)
        placed["header"] = header_out.name
    if "cuda" in manifest:  # a CUDA module's constants go beside it, under their own name
        place(library.parent / manifest["cuda"]["constants"], output.parent / manifest["cuda"]["constants"])
    staged = manifest_out.with_name(f".{manifest_out.name}.{uuid.uuid4().hex}.tmp")
    staged.write_text(json.dumps(placed, indent=2) + "\n")
    os.replace(staged, manifest_out)
    return header_out, manifest_out


def cmd_compile(args: argparse.Namespace) -> int:
    from cuvil.compiler import compile as compile_model
    from cuvil.compiler import resolve_target

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
    dim_max = parse_dim_max(args.dim_max)
    dim_ranges = parse_dim_ranges(args.dim_range)
    if dim_max and shapes:
        raise InputError("--dim-max sizes a library for a whole shape class; --specialize compiles one for given "
                         "shapes: give one", location="--dim-max")
    if args.threads is not None and args.threads < 1:
        raise InputError(f"--threads must be at least 1, got {args.threads}", location="--threads")
    suffix = resolve_target(args.target).library_suffix  # .wasm for wasm32-wasi
    output = check_output(args.output or str(Path.cwd() / f"lib{model_path.stem}{suffix}"), "--output",
                          suffix=suffix)
    assert output is not None
    options: dict[str, Any] = {}
    if args.static_input:
        named, positional = read_bindings(args.static_input, "--static-input")
        if positional:
            raise InputError("--static-input values must be named", hint="write --static-input NAME=FILE.npy")
        options["static_inputs"] = named
    if dim_ranges:
        if model_path.suffix.lower() != ".onnx":
            raise InputError("--dim-range declares the dims of an ONNX model's inputs", location="--dim-range",
                             hint="a .pt2 export carries its dims' ranges (torch.export.Dim min/max)")
        options["dim_ranges"] = dim_ranges
    options.update(_fp16_options(args, model_path, options))
    if args.precision == "bf16":
        if args.enable_fp16:
            raise UsageError("--precision bf16 and --enable-fp16 choose two precisions for the same ops",
                             location="--precision", hint="keep one of them")
        options["bf16"] = True
    if args.profile:
        options["profile"] = True
    gate = _make_gate(args)
    passes: Any = args.passes
    from cuvil.passes.plugins import resolve_pipeline

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
                              dynamic=False, failsafe=args.failsafe, shape_class=not shapes,
                              dim_max=dim_max or None, int8=False if args.no_int8 else None, **options)
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
    if man.get("shape_class"):
        sc = ShapeClass.from_json(man["shape_class"])
        out.write("  dims      " + ", ".join(f"{s} in [{sc.bound(s)[0]}, {sc.bound(s)[1]}]" for s in sc.symbols)
                  + " (one library for the shape class; the dims are read from the input shapes)\n")
    _print_verification(man.get("verification"))
    _print_precision(man.get("precision"))
    _print_int8(man.get("int8"))
    _print_guard(man.get("guard"), man.get("failsafe"))
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
    if entry.get("mode") == "bf16":
        sys.stdout.write(f"  bf16      {entry.get('bf16_products')} products by constant weights (matmul, conv) in "
                         f"bfloat16, summed in float32; {entry.get('fp32_products')} kept float32\n")
        for k in entry.get("kept_fp32", [])[:10]:
            sys.stdout.write(f"    {k.get('value')} {k.get('op')}: {k.get('reason')}\n")
        return
    sys.stdout.write(f"  fp16      {entry.get('fp16_ops')} ops in float16, {entry.get('fp32_ops')} kept float32 "
                     f"({entry.get('unproved')} not proved safe); `precision` in the manifest lists them\n")
    unproved = [k for k in entry.get("kept_fp32", []) if k.get("cause") != "type"]
    for k in unproved[:10]:
        sys.stdout.write(f"    {k.get('value')} {k.get('op')}: {k.get('reason')}\n")
    if len(unproved) > 10:
        sys.stdout.write(f"    ... and {len(unproved) - 10} more\n")


def _print_int8(entry: Any) -> None:
    if not isinstance(entry, dict):
        return
    if entry.get("applied"):
        sys.stdout.write(f"  int8      {entry.get('integer_products')} quantized products in int8 x int8 -> int32; "
                         f"{entry.get('int32_sites_proved')} of {entry.get('int32_sites')} int32 values proved not "
                         f"to wrap for any finite input\n")
    else:
        sys.stdout.write(f"  int8      the QDQ graph runs in float32: {entry.get('reason')}\n")


def _print_guard(guard: Any, policy: Any) -> None:
    if not isinstance(guard, dict) or not isinstance(policy, dict):
        return
    checks = [f"{c.get('side')} {c.get('tensor')} in [{c.get('lo')}, {c.get('hi')}]" if c.get("check") == "box"
              else f"{c.get('side')} {c.get('tensor')} finite" for c in guard.get("checks", [])]
    sys.stdout.write(f"  guard     policy {str(policy.get('policy_digest'))[:16]} (spec "
                     f"{policy.get('spec', {}).get('name')}): {'; '.join(checks) or 'nothing to check'}\n")
    sys.stdout.write(f"            faults: inputs -> {guard.get('input_fault')}, outputs -> {guard.get('output_fault')}"
                     f"; {guard.get('symbol')}(code) names them\n")


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
# registration


def register(sub: Any) -> None:
    """Add ``compile`` to the ``cuvil`` command's subparsers."""
    p = sub.add_parser("compile", help="compile a model to a native shared library (+ C header, manifest)",
                       epilog=COMPILE_EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", help="the model (.onnx, .pt2 or .cir); or use --input")
    p.add_argument("--input", "-i", metavar="MODEL", help="the model: .onnx, .pt2 or .cir")
    p.add_argument("--output", "-o", metavar="LIB.so|.wasm|.ptx",
                   help="the library to write (default: lib<model>.so here); <stem>.h and <stem>.json go beside it")
    p.add_argument("--target", default=None, metavar="TRIPLE",
                   help="target: host (default: tuned for this machine's CPU), aarch64-linux-gnu (ARMv8-A + NEON; "
                        "linked with aarch64-linux-gnu-gcc, run here under qemu-aarch64) or wasm32-wasi (a .wasm "
                        "module with SIMD128, linked with wasm-ld, run here with wasmtime) or cuda (PTX for NVIDIA "
                        "GPUs sm_75+, checked with ptxas, run through the CUDA driver)")
    p.add_argument("--opt-level", default="O3", metavar="O0..O3", help="optimization level (default O3)")
    p.add_argument("--passes", default=None, metavar="SPEC",
                   help="a pass pipeline instead of the opt level's (e.g. 'O2' or 'fold-batchnorm,dce')")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="the library's thread pool size (default: $CUVIL_NUM_THREADS, else the CPUs it may run on); "
                        "its kernels' blocks are cut for that many threads")
    p.add_argument("--shape", "--specialize", dest="shape", action="append", default=[], metavar="NAME=2x3x224x224",
                   help="specialize the library to this shape of an input with symbolic dims; repeatable. Without "
                        "it, a model with symbolic dims compiles to one library for its whole shape class, which "
                        "takes the dims at run time")
    p.add_argument("--dim-max", action="append", default=[], metavar="DIM=N",
                   help="the largest value of a symbolic dim a shape-class library serves (its working memory is "
                        "sized for it); needed for a dim the model does not bound; repeatable")
    p.add_argument("--dim-range", action="append", default=[], metavar="DIM=LO:HI",
                   help="declare the range of a symbolic dim of an ONNX model (the library refuses others): the "
                        "import decides what the range decides, such as a branch on a dim that is 1 for every "
                        "length in it, so one library serves a model that would otherwise need --specialize; "
                        "repeatable")
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
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="bf16: every float32 matmul (even K) and ungrouped conv by constant weights takes bfloat16 "
                        "operands and sums their products in float32 (vdpbf16ps where the CPU has AVX512-BF16); a "
                        "declared precision change, counted in the manifest's `precision`; every other op stays "
                        "float32")
    p.add_argument("--range", action="append", default=[], metavar="NAME=LO:HI",
                   help="with --enable-fp16: the declared range of an input (every element in [LO, HI]); one per "
                        "input, integer inputs such as token ids included; repeatable")
    p.add_argument("--calibrate", metavar="DIR",
                   help="with --enable-fp16: take the ranges not given by --range from .npy/.npz samples in DIR "
                        "(NAME.npy, NAME_*.npy, or .npz with named arrays)")
    p.add_argument("--no-int8", action="store_true",
                   help="compile a QDQ model's float graph as it is; by default (O3) its quantized matmuls and "
                        "convs run in int8 x int8 -> int32 (QLinear semantics, possibly one quantization step from "
                        "the float graph) when the prober proves no int32 accumulator wraps")
    p.add_argument("--profile", action="store_true",
                   help="build a library that times every op of each run (the monotonic clock read around each, "
                        "about 20 ns a read; Linux targets); `cuvil run --profile N` prints where the time goes")
    p.add_argument("--failsafe", metavar="POLICY.json", default=None,
                   help="build the fail-safe policy's guard into the library: inputs finite and inside the "
                        "policy's boxes, outputs finite, checked before and after each run (a violation returns "
                        "CUVIL_ERR_INPUT_BOX, CUVIL_ERR_INPUT_NONFINITE or CUVIL_ERR_OUTPUT_NONFINITE)")
    p.set_defaults(handler=cmd_compile)
