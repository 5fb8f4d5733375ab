"""``cuvil lora check``: an adapter checked against the base model it claims to fit, before it is
loaded or merged (exit 0 every check passes, 1 a check fails, 2 usage or input error).
``cuvil lora merge``: adapters merged into the base's CIR with every step proved (exit 0 merged and
proved, 1 a check fails or a step is refuted, 3 a step could not be proved)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cuvil.cli.common import (
    EXIT_CODES,
    EXIT_FAILED,
    EXIT_OK,
    add_report_arguments,
    check_report_outputs,
    write_reports,
)
from cuvil.errors import InputError


def _base(path: str, names: str | None = None) -> Any:
    """The base an adapter is checked against: a Hugging Face directory, or an ONNX model named by its
    initializers (or by ``names``, a Hugging Face directory whose weights it holds)."""
    from lora.base import BaseModel

    p = Path(path)
    if names is not None:
        return BaseModel.from_directory(names)
    if p.is_dir():
        return BaseModel.from_directory(p)
    if not p.exists():
        raise InputError(f"--base {path}: no such file or directory", location="--base")
    if p.suffix == ".onnx":
        from lora.onnx_base import base_from_onnx

        return base_from_onnx(p)
    raise InputError(f"--base {path}: an adapter is checked against a Hugging Face model directory "
                     "(config.json + safetensors weights) or an ONNX model", location="--base",
                     hint="save the base with model.save_pretrained(DIR, safe_serialization=True)")


@contextlib.contextmanager
def _progress(enabled: bool) -> Iterator[Callable[[int, int, str], None]]:
    """A transient progress bar on stderr over the adapted modules."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=True, disable=not enabled)
    task = bar.add_task("checking", total=None)

    def advance(done: int, total: int, module: str) -> None:
        bar.update(task, completed=done, total=total, description=f"checking {module}")

    with bar:
        yield advance


def cmd_check(args: argparse.Namespace) -> int:
    from cuvil import __version__
    from lora.adapter import Adapter
    from lora.checks import check_adapter
    from lora.report import to_report
    from reports import render_terminal

    check_report_outputs(args)
    adapter = Adapter(args.adapter)
    base = _base(args.base, args.names)
    with _progress(enabled=not args.quiet) as advance:
        result = check_adapter(adapter, base, dtype=args.dtype, identity=args.identity, progress=advance)
    settings = {"dtype": args.dtype, "identity": args.identity,
                "command_line": " ".join(["cuvil", *sys.argv[1:]]) if sys.argv else "cuvil lora check"}
    report = to_report(result, version=__version__, settings=settings)
    write_reports(report, args)
    if not args.quiet:
        render_terminal(report)
    return EXIT_OK if result.passed else EXIT_FAILED


def cmd_merge(args: argparse.Namespace) -> int:
    import json

    from cuvil.cli.common import check_output, parse_range
    from lora.adapter import Adapter
    from lora.attach import WeightedAdapter
    from lora.merge import merge_adapters

    onnx_base = Path(args.base).suffix == ".onnx"
    check_output(args.output, "--output", suffix=".onnx" if onnx_base and args.output.endswith(".onnx") else ".cir")
    check_output(args.certificate, "--certificate")
    weights = args.weight or [1.0] * len(args.adapter)
    if len(weights) != len(args.adapter):
        raise InputError(f"{len(weights)} --weight for {len(args.adapter)} --adapter", location="--weight",
                         hint="give one --weight per --adapter, in the same order, or none")
    adapters = [WeightedAdapter(Adapter(d), w) for d, w in zip(args.adapter, weights, strict=True)]
    module, base = _merge_base(args)
    ranges = dict(parse_range(r) for r in args.range or []) or None
    result = merge_adapters(module, base, adapters, dtype=args.dtype, ranges=ranges, timeout=args.timeout)
    if args.output.endswith(".onnx"):
        _write_onnx(args.base, result, base, adapters, args.output)
    else:
        from cuvil.ir.printer import export_ir

        export_ir(result.merged, args.output)
    if args.certificate:
        Path(args.certificate).write_text(json.dumps(result.certificate(), indent=2) + "\n")
    if not args.quiet:
        summary = result.verification.summary().splitlines()[-1]
        sys.stderr.write(f"merged {len(result.attachments)} adapted module(s) into {args.output}: {summary}; "
                         f"rounding of merged vs unmerged <= {result.max_per_unit:.3g} x max|x| per op\n")
    return EXIT_OK


def _merge_base(args: argparse.Namespace) -> tuple[Any, Any]:
    """The base's CIR and its module names: a Hugging Face directory exported at ``--shape``, or an
    ONNX model (named by its initializers or by ``--names``)."""
    from cuvil.cli.common import parse_shapes
    from cuvil.frontend.dispatch import import_model
    from lora.base import BaseModel
    from lora.hf_model import example_inputs, load_model

    path = Path(args.base)
    if path.is_dir():
        model = load_model(path)
        module = import_model(model, example_inputs=example_inputs(model, parse_shapes(args.shape or [])))
        return module, BaseModel.from_torch(model, args.base)
    if path.suffix != ".onnx" or not path.is_file():
        raise InputError(f"--base {args.base}: adapters are merged into a Hugging Face model directory or an "
                         "ONNX model", location="--base")
    if args.shape:
        raise InputError("--shape applies to a Hugging Face base (an ONNX model has its own input shapes)",
                         location="--shape")
    return import_model(str(path)), _base(args.base, args.names)


def _write_onnx(source: str, result: Any, base: Any, adapters: Any, output: str) -> None:
    """The merged ONNX model, re-imported and checked to be the proved merged module (by content)."""
    from cuvil.frontend.dispatch import import_model
    from cuvil.passes.manager import run_pipeline
    from lora.merge import site_weights
    from lora.onnx_base import write_merged

    write_merged(source, site_weights(result, base, adapters), output)
    written = run_pipeline(import_model(output), ["fold-constants"]).module
    if written.main != result.merged.main:  # values are interned: equal functions are equal graphs and constants
        Path(output).unlink()
        raise RuntimeError(f"the merged ONNX model {output} does not import to the proved merged module")


def cmd_stamp(args: argparse.Namespace) -> int:
    from lora.identity import stamp

    digests = stamp(args.adapter, _base(args.base, args.names))
    if not args.quiet:
        sys.stderr.write(f"recorded the digest of {len(digests)} base weight(s) in {args.adapter}; "
                         "`cuvil lora check` now compares them\n")
    return EXIT_OK


def register(sub: Any) -> None:
    """Add ``lora`` (with ``check``) to the ``cuvil`` command's subparsers."""
    p = sub.add_parser("lora", help="check LoRA adapters against their base model before loading or merging")
    actions = p.add_subparsers(dest="lora_command", metavar="ACTION", required=True)
    c = actions.add_parser("check", help="check an adapter's keys, shapes, values and merged range",
                           epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("--base", required=True, metavar="MODEL",
                   help="the base model: a Hugging Face model directory (config.json + safetensors), loaded "
                        "offline, or an ONNX model")
    c.add_argument("--names", metavar="DIR",
                   help="for an ONNX base whose exporter renamed the weights: the Hugging Face directory that "
                        "names its modules")
    c.add_argument("--adapter", required=True, metavar="DIR",
                   help="a PEFT adapter directory (adapter_config.json + adapter_model.safetensors)")
    c.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default="fp32",
                   help="the dtype the merged weights would ship in (overflow and precision are judged in it)")
    c.add_argument("--identity", choices=("warn", "error"), default="warn",
                   help="whether a base model other than the one the adapter records is an error")
    add_report_arguments(c)
    c.add_argument("-q", "--quiet", action="store_true", help="no terminal summary")
    c.set_defaults(handler=cmd_check)
    t = actions.add_parser("stamp", help="record in an adapter the content digest of every base weight it adapts",
                           epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("--base", required=True, metavar="MODEL", help="the base the adapter was trained on")
    t.add_argument("--names", metavar="DIR", help="for an ONNX base whose exporter renamed the weights")
    t.add_argument("--adapter", required=True, metavar="DIR", help="the PEFT adapter directory to stamp")
    t.add_argument("-q", "--quiet", action="store_true", help="no summary on stderr")
    t.set_defaults(handler=cmd_stamp)
    m = actions.add_parser("merge", help="merge adapters into the base model's CIR, every step proved",
                           epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    m.add_argument("--base", required=True, metavar="MODEL",
                   help="the base model: a Hugging Face model directory (config.json + safetensors), loaded "
                        "offline, or an ONNX model")
    m.add_argument("--adapter", required=True, action="append", metavar="DIR",
                   help="a PEFT adapter directory; repeat to combine several (DoRA adapters merge alone)")
    m.add_argument("--weight", action="append", type=float, metavar="W",
                   help="the weight of each --adapter's update, in order (default 1)")
    m.add_argument("-o", "--output", required=True, metavar="OUT.cir|OUT.onnx",
                   help="where the merged model goes: CIR, or (for an ONNX base) an ONNX model whose merged "
                        "initializers hold the proved merged weights")
    m.add_argument("--names", metavar="DIR",
                   help="for an ONNX base whose exporter renamed the weights: the Hugging Face directory the "
                        "adapter was trained on (its weights are matched to the ONNX model's by content)")
    m.add_argument("--certificate", metavar="FILE.json",
                   help="write the certificate: the proofs of the merge and the rounding bound per adapted op")
    m.add_argument("--shape", action="append", metavar="NAME=DIMS",
                   help="the shape the model is exported at (default input_ids=1x8, or one image); repeatable")
    m.add_argument("--range", action="append", metavar="NAME=LO:HI",
                   help="an input box: the certificate then also bounds the rounding absolutely; repeatable")
    m.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default="fp32",
                   help="the dtype the merged weights ship in (the checks refuse merges that overflow it)")
    m.add_argument("--timeout", type=float, default=60.0, metavar="S", help="time limit per proof (seconds)")
    m.add_argument("-q", "--quiet", action="store_true", help="no summary on stderr")
    m.set_defaults(handler=cmd_merge)
