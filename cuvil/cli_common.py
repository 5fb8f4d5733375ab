"""What every ``cuvil`` subcommand shares: exit codes, reading models and input arrays, error reports.

The subcommand modules (cuvil.cli_compile, cuvil.cli_opt, verify.cli, verify.probe.cli) import
this module, and cuvil.cli assembles them: the commands depend on it, never on each other.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.errors import CuvilError, InputError, ModelLoadError

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2

EXIT_CODES = f"""exit codes:
  {EXIT_OK}  success
  {EXIT_INTERNAL}  internal error: a bug in cuvil (the traceback is printed; please report it)
  {EXIT_USAGE}  usage or input error: bad arguments, a missing/malformed/unsupported model,
     malformed .cir, inputs that do not match the model (the message names the code,
     the location and a hint)
"""


def load_array(path: str, what: str) -> np.ndarray | dict[str, np.ndarray]:
    """Read .npy/.npz without unpickling (a data file never runs code)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{what} file {p} does not exist", location=str(p))
    try:
        data = np.load(p, allow_pickle=False)
    except ValueError as e:
        raise InputError(f"cannot read {what} file {p}: {e}", location=str(p),
                         hint="save arrays with numpy.save (.npy) or numpy.savez (.npz); object arrays "
                              "are not accepted") from None
    except OSError as e:
        raise InputError(f"cannot read {what} file {p}: {e}", location=str(p)) from None
    if isinstance(data, np.lib.npyio.NpzFile):
        with data:
            return {k: data[k] for k in data.files}
    return data


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


def import_model_file(path: str, static_specs: Sequence[str] = ()) -> Any:
    from cuvil.frontend.dispatch import import_model

    options: dict[str, Any] = {}
    if static_specs:
        named, positional = read_bindings(static_specs, "--static-input")
        if positional:
            raise InputError("--static-input values must be named", hint="write --static-input NAME=FILE.npy")
        options["static_inputs"] = named
    p = Path(path)
    if not p.exists():
        raise ModelLoadError(f"model file {p} does not exist", location=str(p))
    try:
        return import_model(p, **options)
    except ModuleNotFoundError as e:
        raise ModelLoadError(f"cannot import {p}: {e}", location=str(p),
                             hint="the torch frontend needs `pip install cuvil[torch]`") from None


def file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip(".") or "output"


def report_error(e: CuvilError) -> None:
    """One clear message: code, what happened, where, and what to do."""
    lines = [f"error[{e.code}]: {e.message}"]
    if e.location:
        lines.append(f"  at: {e.location}")
    if e.hint:
        lines.append(f"  hint: {e.hint}")
    sys.stderr.write("\n".join(lines) + "\n")
