"""What every ``cuvil`` subcommand shares: exit codes, error reports, and the parsing of what a
command line names (models, input arrays, shapes, ranges, plugins, output paths).

The subcommand modules import this module and :mod:`cuvil.cli` assembles them: the commands
depend on it, never on each other.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from cuvil.errors import CuvilError, FileAccessError, InputError, ModelLoadError, UsageError

if TYPE_CHECKING:
    from cuvil.passes.base import Pass

EXIT_OK = 0
EXIT_FAILED = 1
"""A check failed: an obligation refuted, an overflow confirmed, a gated compile stopped by a
refutation, an artifact or certificate that does not match."""
EXIT_USAGE = 2
EXIT_UNDECIDED = 3
"""A check could not decide: obligations unknown, probe sites open, a gated compile stopped by
an unproved application."""
EXIT_INTERNAL = 70
"""A bug in Cuvil (never the code of a verdict); sysexits' EX_SOFTWARE."""
EXIT_INTERRUPTED = 130

EXIT_CODES = f"""exit codes (the same for every subcommand):
  {EXIT_OK}   success (verify: every obligation proved; probe: every site safe)
  {EXIT_FAILED}   a check failed: an obligation refuted (with its replayed counterexample), an
      overflow confirmed, a gated compile stopped by a refutation, an artifact or
      certificate that does not match
  {EXIT_USAGE}   usage or input error: bad arguments, a missing/malformed/unsupported model,
      inputs that do not match the model, an unwritable output (a CuvilError: the message
      names the code, the location and a hint)
  {EXIT_UNDECIDED}   a check could not decide: obligations unknown, probe sites open, a gated
      compile stopped by an application that is not proved
  {EXIT_INTERNAL}  internal error: a bug in cuvil (a one-line report; run with -v for the traceback)
  {EXIT_INTERRUPTED} interrupted
"""

VERDICT_EXITS = {"CUVIL-PROOF-REFUTED": EXIT_FAILED, "CUVIL-PROOF-UNKNOWN": EXIT_UNDECIDED,
                 "CUVIL-FP16-UNPROVED": EXIT_UNDECIDED, "CUVIL-LORA-REFUSED": EXIT_FAILED,
                 "CUVIL-FAILSAFE-GUARD": EXIT_FAILED}
"""Errors that carry a verdict: their exit code is the verdict's, not a usage error's."""


MODEL_HELP = "a model: .onnx, .pt2 or .cir"
STATIC_HELP = "bind a graph input to a compile-time value (for inputs used as shapes); repeatable"
OPT_LEVELS = {"O0": 0, "O1": 1, "O2": 2, "O3": 3}
_DIMS = re.compile(r"^\d+(?:[x,]\d+)*$|^$")


def exit_for(error: CuvilError) -> int:
    return VERDICT_EXITS.get(error.code, EXIT_USAGE)


def load_array(path: str, what: str) -> np.ndarray | dict[str, np.ndarray]:
    """Read .npy/.npz without unpickling (a data file never runs code)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{what} file {p} does not exist", location=str(p))
    try:
        data = np.load(p, allow_pickle=False)
        if isinstance(data, np.lib.npyio.NpzFile):
            with data:
                return {k: data[k] for k in data.files}
        return data
    except Exception as e:  # a file that is not what numpy writes: never a bug of ours
        raise InputError(f"cannot read {what} file {p}: {type(e).__name__}: {e}", location=str(p),
                         hint="save arrays with numpy.save (.npy) or numpy.savez (.npz); object arrays "
                              "are not accepted") from None


def key_value(spec: str, flag: str) -> tuple[str | None, str]:
    if "=" in spec:
        name, _, path = spec.partition("=")
        if not name or not path:
            raise InputError(f"{flag} {spec!r} is malformed", hint=f"write {flag} NAME=FILE.npy")
        return name, path
    return None, spec


def read_bindings(specs: Sequence[str], flag: str) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    named: dict[str, np.ndarray] = {}
    positional: list[np.ndarray] = []
    for spec in specs:
        name, path = key_value(spec, flag)
        data = load_array(path, "input")
        if isinstance(data, dict):
            if name is not None:
                raise InputError(f"{flag} {spec!r}: an .npz file holds named arrays already",
                                 hint=f"write {flag} FILE.npz")
            named.update(data)
        elif name is None:
            positional.append(data)
        else:
            named[name] = data
    if named and positional:
        raise InputError(f"mix of named and positional {flag} values", hint=f"name them all: {flag} NAME=FILE.npy")
    return named, positional


def import_model_file(path: str, static_specs: Sequence[str] = (), *, dims: Mapping[str, int] | None = None,
                      shape_specs: Sequence[str] = ()) -> Any:
    """Import the model at ``path``. A model whose import decides on a dim's value (CUVIL-DYNAMIC-INPUT)
    is imported again with its dims pinned, when ``dims`` (``--dim``) or ``shape_specs`` (``--shape``)
    give them, as a compile does per shape."""
    from cuvil.frontend.dispatch import import_model
    from cuvil.frontend.onnx_node import SymbolicValueRequired

    options: dict[str, Any] = {}
    if static_specs:
        named, positional = read_bindings(static_specs, "--static-input")
        if positional:
            raise InputError("--static-input values must be named", hint="write --static-input NAME=FILE.npy")
        options["static_inputs"] = named
    p = Path(path)
    if p.is_dir():
        raise ModelLoadError(f"{p} is a folder, not a model file", location=str(p),
                             hint="give a .onnx, .pt2 or .cir file")
    if not p.exists():
        raise ModelLoadError(f"model file {p} does not exist", location=str(p))
    try:
        try:
            return import_model(p, **options)
        except SymbolicValueRequired:
            pinned = {**_dims_of_shapes(p, options, shape_specs), **(dims or {})}
            if not pinned:
                raise
            return import_model(p, **options, dims=pinned)
    except ModuleNotFoundError as e:
        raise ModelLoadError(f"cannot import {p}: {e}", location=str(p),
                             hint="the torch frontend needs `pip install cuvil[torch]`") from None


def _dims_of_shapes(path: Path, options: Mapping[str, Any], specs: Sequence[str]) -> dict[str, int]:
    """The symbolic dims the ``--shape`` specs give the model's declared inputs."""
    if not specs:
        return {}
    from cuvil.frontend.onnx_import import declared_types
    from cuvil.ir.types import bind_symbols

    declared = dict(declared_types(path, static_inputs=options.get("static_inputs"))[0])
    shapes = parse_shapes(list(specs))
    known = [n for n in shapes if n in declared]
    try:
        return bind_symbols([declared[n] for n in known], [shapes[n] for n in known])
    except ValueError as e:
        raise InputError(f"--shape does not fit the model's inputs: {e}",
                         hint="inputs: " + ", ".join(f"{n}: {t}" for n, t in declared.items())) from None


def check_output(path: str | None, flag: str, *, folder: bool = False, suffix: str | None = None) -> Path | None:
    """Validate an output path before any work is done, so a long run never fails at its last step.

    A missing folder is created (like ``mkdir -p``) once its nearest existing ancestor is a
    writable folder; ``folder=True`` means the output is itself a folder.
    """
    if path is None:
        return None
    p = Path(path)
    if folder:
        if p.exists() and not p.is_dir():
            raise FileAccessError(f"{flag} {p} is a file, not a folder", location=str(p),
                                  hint="give a folder (it is created when missing)")
        parent = p
    else:
        if p.is_dir():
            raise FileAccessError(f"{flag} {p} is a folder", location=str(p), hint="give a file name")
        if suffix is not None and p.suffix != suffix:
            raise InputError(f"{flag} {p} must end in {suffix}", location=flag,
                             hint=f"name the file like out/libmodel{suffix}")
        parent = p.parent
    ancestor = parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise FileAccessError(f"{flag}: {ancestor} is a file, so the folder {parent} cannot be made",
                              location=str(p), hint="choose a location under a folder")
    if not os.access(ancestor, os.W_OK):
        raise FileAccessError(f"{flag}: the folder {ancestor} is not writable", location=str(p),
                              hint="choose a location you may write to")
    parent.mkdir(parents=True, exist_ok=True)
    return p


def check_seconds(value: float, flag: str) -> float:
    """A time limit: finite and positive (every solver query and search has one)."""
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"{flag} must be a positive number of seconds, got {value}", location=flag,
                         hint=f"e.g. {flag} 60")
    return value


def io_error(e: OSError) -> CuvilError:
    """A file operation the environment refused, as a user error naming the path."""
    import errno

    if e.errno == errno.EBADF:
        return FileAccessError("the output stream is closed",
                               hint="run the command with its standard output open (a file or a pipe)")
    path = e.filename or ""
    reason = e.strerror or str(e)
    hints = {errno.ENOENT: "create the folder first, or check the path",
             errno.EISDIR: "give a file name, not a folder", errno.ENOTDIR: "a part of the path is a file",
             errno.EACCES: "choose a location you may write to", errno.EEXIST: "that path exists as a file",
             errno.ENOSPC: "free some space, or write elsewhere"}
    return FileAccessError(f"{reason}: {path}" if path else reason, location=str(path) or None,
                           hint=hints.get(e.errno or -1, "check the path and its permissions"))


def file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip(".") or "output"


class ArgumentParser(argparse.ArgumentParser):
    """argparse with its usage errors reported like every other error: a code, where, a hint."""

    def error(self, message: str) -> NoReturn:
        report_error(UsageError(message, location=self.prog, hint=f"run `{self.prog} --help` for the options"))
        self.print_usage(sys.stderr)
        sys.exit(EXIT_USAGE)


def report_error(e: CuvilError) -> None:
    """One clear message: code, what happened, where, and what to do."""
    lines = [f"error[{e.code}]: {e.message}"]
    if e.location:
        lines.append(f"  at: {e.location}")
    if e.hint:
        lines.append(f"  hint: {e.hint}")
    sys.stderr.write("\n".join(lines) + "\n")


# --------------------------------------------------------------------------------------
# opt levels, shapes, ranges


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


def parse_dim_max(specs: list[str]) -> dict[str, int]:
    """``DIM=N`` per symbolic dim: the largest value a shape-class library serves."""
    out: dict[str, int] = {}
    for spec in specs:
        name, eq, value = spec.rpartition("=")
        if not eq or not name or not re.fullmatch(r"\s*\d+\s*", value):
            raise InputError(f"--dim-max {spec!r} is malformed", location="--dim-max",
                             hint="write --dim-max DIM=N with a whole number N, e.g. --dim-max seq=512")
        if name in out:
            raise InputError(f"--dim-max gives dim {name!r} twice", location="--dim-max")
        out[name] = int(value)
    return out


def parse_dim_ranges(specs: list[str]) -> dict[str, tuple[int, int]]:
    """``DIM=LO:HI`` per symbolic dim: its declared range."""
    out: dict[str, tuple[int, int]] = {}
    for spec in specs:
        name, eq, value = spec.rpartition("=")
        m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", value)
        if not eq or not name or m is None or int(m.group(1)) > int(m.group(2)):
            raise InputError(f"--dim-range {spec!r} is malformed", location="--dim-range",
                             hint="write --dim-range DIM=LO:HI with whole numbers LO <= HI, e.g. --dim-range "
                                  "seq=16:512")
        if name in out:
            raise InputError(f"--dim-range gives dim {name!r} twice", location="--dim-range")
        out[name] = (int(m.group(1)), int(m.group(2)))
    return out


def specialize_shapes(module: Any, specs: Sequence[str]) -> Any:
    """``module`` with its main function at the ``--shape NAME=DIMS`` shapes."""
    from cuvil.ir.module import Module
    from cuvil.ir.specialize import specialize_function

    main = module.main
    fn, _ = specialize_function(main, input_shapes=parse_shapes(list(specs)))
    return Module(tuple(fn if f is main else f for f in module.functions), module.constants, module.metadata)


_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?inf"


def parse_range(spec: str) -> tuple[str, tuple[float, float]]:
    """``NAME=LO:HI`` -> (name, (lo, hi))."""
    m = re.fullmatch(rf"\s*([^=]+?)\s*=\s*({_NUMBER})\s*:\s*({_NUMBER})\s*", spec)
    if m is None:
        raise InputError(f"--range {spec!r} is malformed", hint="write --range NAME=LO:HI, e.g. --range x=-1:1")
    lo, hi = float(m.group(2)), float(m.group(3))
    if lo > hi:
        raise InputError(f"--range {spec!r} is empty (low > high)", hint="write the low end first")
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise InputError(f"--range {spec!r} is unbounded", hint="probing needs finite ranges")
    return m.group(1), (lo, hi)


def calibration_ranges(folder: str | Path, names: list[str]) -> dict[str, tuple[float, float]]:
    """Per-input [min, max] over a folder of .npy (``NAME.npy``, ``NAME_*.npy``, ``NAME.*.npy``) or
    .npz (named arrays) files."""
    root = Path(folder)
    if not root.is_dir():
        raise InputError(f"calibration folder {root} does not exist", location=str(root))
    seen: dict[str, list[np.ndarray]] = {}
    for path in sorted(root.iterdir()):
        if path.suffix not in (".npy", ".npz"):
            continue
        try:
            data = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as e:
            raise InputError(f"cannot read calibration file {path}: {e}", location=str(path)) from None
        if isinstance(data, np.lib.npyio.NpzFile):
            with data:
                for k in data.files:
                    seen.setdefault(k, []).append(np.asarray(data[k]))
            continue
        stem = path.stem
        for n in sorted(names, key=len, reverse=True):
            if stem == n or stem.startswith(n + "_") or stem.startswith(n + "."):
                seen.setdefault(n, []).append(np.asarray(data))
                break
    out: dict[str, tuple[float, float]] = {}
    for n, arrays in seen.items():
        flat = np.concatenate([a.astype(np.float64).reshape(-1) for a in arrays])
        flat = flat[np.isfinite(flat)]
        if flat.size:
            out[n] = (float(flat.min()), float(flat.max()))
    return out


# --------------------------------------------------------------------------------------
# pass plugins


def add_plugin_arguments(p: Any) -> None:
    """--pass-plugin and --pass-time-limit, the same for every command that runs a pipeline."""
    p.add_argument("--pass-plugin", action="append", default=[], metavar="pkg.module:PassClass",
                   help="import a Pass subclass and run it (where the pipeline names it, else at the end); "
                        "repeatable")
    p.add_argument("--pass-time-limit", type=float, default=600.0, metavar="S",
                   help="seconds a plugin pass may run before it is stopped (default 600)")


def plugins_from_args(args: Any) -> list[Pass]:
    """The plugins the command line names, loaded, with the process's plugin time limit set."""
    from cuvil.passes.manager import set_plugin_time_limit
    from cuvil.passes.plugins import load_pass_plugin

    set_plugin_time_limit(check_seconds(args.pass_time_limit, "--pass-time-limit"))
    return [load_pass_plugin(s) for s in args.pass_plugin]


REPORT_FILES = (("--json", "json", "write the report as JSON"), ("--sarif", "sarif", "write the report as SARIF 2.1.0"),
                ("--html", "html", "write a self-contained HTML report"))
"""The report files a checking command writes: flag, argument name, help."""


def add_report_arguments(parser: Any) -> None:
    for flag, _, text in REPORT_FILES:
        parser.add_argument(flag, metavar="FILE", help=text)


def check_report_outputs(args: Any) -> None:
    """Refuse an unwritable report path before any work is done."""
    for flag, name, _ in REPORT_FILES:
        check_output(getattr(args, name), flag)


def write_reports(report: Any, args: Any) -> None:
    """Write ``report`` (a :class:`reports.Report`) to every file the command line asked for."""
    from reports import write_html, write_json, write_sarif

    writers = {"json": write_json, "sarif": write_sarif, "html": write_html}
    for _, name, _ in REPORT_FILES:
        if getattr(args, name):
            writers[name](report, getattr(args, name))
