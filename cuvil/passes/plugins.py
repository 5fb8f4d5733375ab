"""User passes named on the command line (``--pass-plugin pkg.module:PassClass``).

Importing the module runs its code: that is what the user asked for by naming it. The pass
joins a pipeline by its name (``-p canonicalize,my-pass``) or, when the pipeline does not name
it, is appended at the end.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from cuvil.errors import InputError, PluginError
from cuvil.passes.base import Pass


def load_pass_plugin(spec: str) -> Pass:
    """``pkg.module:PassClass`` -> an instance of that Pass subclass (made with no arguments)."""
    module_name, sep, class_name = spec.partition(":")
    if not sep or not module_name or not class_name:
        raise InputError(f"--pass-plugin {spec!r} is malformed", location="--pass-plugin",
                         hint="write --pass-plugin package.module:PassClass")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise InputError(f"cannot import {module_name!r} for --pass-plugin: {e}", location="--pass-plugin",
                         hint="put the folder holding the module on PYTHONPATH") from None
    except Exception as e:  # the plugin's own code failed while it was imported
        raise PluginError(f"importing {module_name!r} for --pass-plugin raised {type(e).__name__}: {e}",
                          location="--pass-plugin") from None
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Pass)):
        raise InputError(f"{spec} is not a cuvil Pass subclass", location="--pass-plugin",
                         hint="a plugin is a subclass of cuvil.passes.Pass with a name and a contract")
    try:
        instance = cls()
    except TypeError as e:
        raise InputError(f"cannot create {spec} without arguments: {e}", location="--pass-plugin",
                         hint="give every option of the pass a default") from None
    if not instance.name:
        raise InputError(f"{spec} has no pass name", location="--pass-plugin",
                         hint="set the class attribute name = 'my-pass' (kebab-case)")
    return instance


def resolve_pipeline(spec: str | None, plugins: Sequence[Pass], *, default: str = "O3") -> list[Pass]:
    """The pipeline ``spec`` (or ``default``) as Pass objects; a plugin is used where ``spec`` names it,
    else appended."""
    from cuvil.passes.manager import parse_pipeline

    by_name = {p.name: p for p in plugins}
    text = spec if spec else default
    items: list[str | Pass] = [by_name.get(s.strip(), s.strip()) for s in text.split(",") if s.strip()]
    if not items:
        parse_pipeline(text)  # says why an empty spec is malformed
    passes = parse_pipeline(items)
    used = {id(p) for p in passes}
    return passes + [p for p in plugins if id(p) not in used]
