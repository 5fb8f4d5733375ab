"""``cuvil lora check``: an adapter checked against the base model it claims to fit, before it is
loaded or merged (exit 0 every check passes, 1 a check fails, 2 usage or input error)."""

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


def _base(path: str) -> Any:
    from lora.base import BaseModel

    p = Path(path)
    if p.is_dir():
        return BaseModel.from_directory(p)
    if not p.exists():
        raise InputError(f"--base {path}: no such file or directory", location="--base")
    raise InputError(f"--base {path}: an adapter is checked against a Hugging Face model directory "
                     "(config.json + safetensors weights)", location="--base",
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
    base = _base(args.base)
    with _progress(enabled=not args.quiet) as advance:
        result = check_adapter(adapter, base, dtype=args.dtype, identity=args.identity, progress=advance)
    settings = {"dtype": args.dtype, "identity": args.identity,
                "command_line": " ".join(["cuvil", *sys.argv[1:]]) if sys.argv else "cuvil lora check"}
    report = to_report(result, version=__version__, settings=settings)
    write_reports(report, args)
    if not args.quiet:
        render_terminal(report)
    return EXIT_OK if result.passed else EXIT_FAILED


def register(sub: Any) -> None:
    """Add ``lora`` (with ``check``) to the ``cuvil`` command's subparsers."""
    p = sub.add_parser("lora", help="check LoRA adapters against their base model before loading or merging")
    actions = p.add_subparsers(dest="lora_command", metavar="ACTION", required=True)
    c = actions.add_parser("check", help="check an adapter's keys, shapes, values and merged range",
                           epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("--base", required=True, metavar="MODEL",
                   help="the base model: a Hugging Face model directory (config.json + safetensors), loaded offline")
    c.add_argument("--adapter", required=True, metavar="DIR",
                   help="a PEFT adapter directory (adapter_config.json + adapter_model.safetensors)")
    c.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default="fp32",
                   help="the dtype the merged weights would ship in (overflow and precision are judged in it)")
    c.add_argument("--identity", choices=("warn", "error"), default="warn",
                   help="whether a base model other than the one the adapter records is an error")
    add_report_arguments(c)
    c.add_argument("-q", "--quiet", action="store_true", help="no terminal summary")
    c.set_defaults(handler=cmd_check)
