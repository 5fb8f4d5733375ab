"""Steps whose kernels came out the same share one; the copies are dropped before LLVM reads the module.

A network repeats its layers: a 4-layer BERT has nine layer norms, four softmaxes and a dozen residual adds at
one shape, and each step's kernel was emitted on its own, so LLVM optimized and compiled every copy (two fifths
of that model's kernel code). Sameness is decided on the emitted text, the contents of the step's own globals
included, with only the step's name prefix abstracted: two kernels that differ in anything (a packed weight, a
constant they read, a loop hint) stay apart. A loop's id node is compared by what it holds (its hints), not by
its number, which is unique to every loop. Nothing a kernel says about itself is trusted.
"""

from __future__ import annotations

import re

from llvmlite import ir


def step_prefix(k: int) -> str:
    """The name prefix of everything step ``k``'s kernel defines (its functions and its own globals)."""
    return f"k{k}."


_METADATA_REF = re.compile(r"!(\d+)\b")


def _metadata_bodies(mod: ir.Module) -> dict[str, str]:
    """Each numbered metadata node's operands as text, a reference to itself (a loop id's) abstracted."""
    bodies = {}
    for md in mod.metadata:
        ref = md.get_reference()
        body = str(md).split(" = ", 1)[1]
        bodies[ref[1:]] = re.sub(rf"{re.escape(ref)}\b", "!self", body)
    return bodies


_GLOBAL_REF = re.compile(r'@"([^"]+)"|@([-\w.$]+)')


class _Texts(dict[str, str]):
    """Each global's text, printed once and only when asked for (a step's data may be megabytes)."""

    def of(self, gv: ir.GlobalValue) -> str:
        found = self.get(gv.name)
        return found if found is not None else self.setdefault(gv.name, str(gv))


def _signature(members: list[ir.GlobalValue], k: int, text: _Texts, metadata: dict[str, str]) -> str:
    """The members' text with references to the step's own names written without its number and references
    to metadata nodes written as the nodes' contents."""
    own = re.compile(rf'@("?){re.escape(step_prefix(k))}')
    joined = "\n".join(own.sub(r"@\1K.", text.of(gv)) for gv in members)
    return _METADATA_REF.sub(lambda m: metadata.get(m.group(1), m.group(0)), joined)


def _code_and_what_it_reads(members: list[ir.GlobalValue], text: _Texts) -> list[ir.GlobalValue]:
    """A step's functions and the globals of its own they refer to, directly or through another such global;
    its globals that only the call refers to (data passed in an operand slot:
    :func:`cuvil.codegen.kernels.operand_data`) are the step's, not its code's."""
    read: list[ir.GlobalValue] = [gv for gv in members if isinstance(gv, ir.Function)]
    rest = {gv.name: gv for gv in members if not isinstance(gv, ir.Function)}
    frontier = read
    while frontier and rest:
        named = {a or b for gv in frontier for a, b in _GLOBAL_REF.findall(text.of(gv))}
        frontier = [gv for n, gv in rest.items() if n in named]  # in the module's order (not the set's)
        read += frontier
        rest = {n: gv for n, gv in rest.items() if n not in named}
    return read


def share_identical_kernels(mod: ir.Module, kernels: list[ir.Function | None]) -> int:
    """Point each step whose kernel (its functions and the globals they read) has the text of an earlier
    step's at the earlier one and remove its own from ``mod``; returns how many steps now share."""
    families: dict[int, list[ir.GlobalValue]] = {}
    name_of_step = re.compile(r"k(\d+)\.")
    for name, gv in mod.globals.items():
        m = name_of_step.match(name)
        if m is not None:
            families.setdefault(int(m.group(1)), []).append(gv)
    text = _Texts()
    for k, members in families.items():
        families[k] = _code_and_what_it_reads(members, text)
    metadata = _metadata_bodies(mod)
    first: dict[str, int] = {}
    shared = 0
    for k, kernel in enumerate(kernels):
        members = families.get(k)
        if kernel is None or not members or not kernel.name.startswith(step_prefix(k)):
            continue
        j = first.setdefault(_signature(members, k, text, metadata), k)
        if j == k:
            continue
        for gv in members:
            del mod.globals[gv.name]
        kernels[k] = mod.globals[step_prefix(j) + kernel.name[len(step_prefix(k)):]]  # type: ignore[assignment]
        shared += 1
    return shared
