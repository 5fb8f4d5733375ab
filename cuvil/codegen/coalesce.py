"""Elementwise rules over merged axes: the same computation over the same memory, in longer loops.

The generic lowering runs one loop per output axis, so an elementwise op over ``[1, C, 7, 7]`` times a
per-channel ``[1, C, 1, 1]`` (a squeeze-excitation scale) runs an inner loop of seven elements: too short
to vectorize. Where every operand reads the output's axes in order (an axis at the output's index, or a
broadcast axis of one element at index 0), adjacent output axes that every operand either reads together
(contiguous in it) or broadcasts together are one axis of their product: row-major memory is the same, and
each output element is computed from the same operand elements by the same operations. The rule is rewritten
over the merged shapes; a rule that reads anything else (a reduction, a window, an index value, a gather)
is left as it is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from cuvil.ir import rules as R
from cuvil.ir.rulewalk import walk_exprs
from cuvil.ir.types import TensorType

Axes = tuple[int | None, ...]
"""For each dim of an operand: the output axis it is read at, or None (a one-element dim read at 0)."""


def _out_axis(ix: R.Ix) -> int | None:
    if ix.kind == "var" and isinstance(ix.args[0], str) and ix.args[0].startswith("i") and ix.args[0][1:].isdigit():
        return int(ix.args[0][1:])
    return None


def _reads(rule: R.Expr, in_shapes: Sequence[tuple[int, ...]], out_shape: tuple[int, ...]) -> dict[int, Axes] | None:
    """Each loaded operand's axis map, or None when some node reads otherwise."""
    maps: dict[int, Axes] = {}
    for e in walk_exprs(rule):
        if isinstance(e, (R.Lit, R.Call)):
            continue
        if not isinstance(e, R.Load) or e.oob is not None or len(e.index) != len(in_shapes[e.operand]):
            return None
        axes: list[int | None] = []
        for ix, dim in zip(e.index, in_shapes[e.operand], strict=True):
            k = _out_axis(ix)
            if k is not None and k < len(out_shape) and out_shape[k] == dim:
                axes.append(k)
            elif ix.is_lit and ix.value == 0 and dim == 1:
                axes.append(None)
            else:
                return None
        read = [k for k in axes if k is not None]
        if read != sorted(set(read)) or maps.setdefault(e.operand, tuple(axes)) != tuple(axes):
            return None
    return maps


def _groups(out_shape: tuple[int, ...], maps: dict[int, Axes]) -> list[list[int]]:
    """The output's axes of more than one element, in runs every operand reads whole or not at all. The
    outermost stays an axis of its own: the pool splits it among threads while the innermost loop keeps its
    schedule (an ``erf``'s blocks run along the innermost axis, not along the one split in chunks)."""
    kept = [k for k, n in enumerate(out_shape) if n != 1]
    groups: list[list[int]] = []
    reads = [[a for a in axes if a is not None and out_shape[a] != 1] for axes in maps.values()]
    for k in kept:
        if len(groups) > 1 and all(_together(read, groups[-1][-1], k) for read in reads):
            groups[-1].append(k)
        else:
            groups.append([k])
    return groups


def _together(read: list[int], a: int, b: int) -> bool:
    """Whether output axes ``a`` and ``b`` (the next of more than one element) are both broadcast by an
    operand that reads the axes ``read`` (those of more than one element, in its dims' order), or read at
    adjacent dims of it (one-element dims between do not part them in memory)."""
    if a not in read and b not in read:
        return True
    return a in read and b in read and read.index(b) == read.index(a) + 1


def coalesce(rule: R.Expr, in_types: Sequence[TensorType],
             out_type: TensorType) -> tuple[R.Expr, list[TensorType], TensorType] | None:
    """The rule over merged axes with its operand and result types, or None when nothing merges (or the
    rule is not elementwise over static shapes)."""
    if not out_type.is_static or any(not t.is_static for t in in_types):
        return None
    out_shape = tuple(int(d) for d in out_type.shape)
    in_shapes = [tuple(int(d) for d in t.shape) for t in in_types]
    maps = _reads(rule, in_shapes, out_shape)
    if maps is None:
        return None
    groups = _groups(out_shape, maps)
    if not groups or len(groups) == len(out_shape):
        return None
    group_of = {k: g for g, members in enumerate(groups) for k in members}
    new_out = [math.prod(out_shape[k] for k in members) for members in groups]
    new_in = list(in_types)
    index: dict[int, tuple[R.Ix, ...]] = {}
    for j, axes in maps.items():
        read = sorted({group_of[k] for k in axes if k is not None and k in group_of})
        new_in[j] = in_types[j].with_shape([new_out[g] for g in read] or [1])
        index[j] = tuple(R.Ix.var(f"i{g}") for g in read) or (R.Ix.lit(0),)
    memo: dict[int, R.Expr] = {}

    def rebuild(e: R.Expr) -> R.Expr:
        done = memo.get(id(e))
        if done is not None:
            return done
        if isinstance(e, R.Load):
            out: R.Expr = replace(e, index=index[e.operand])
        elif isinstance(e, R.Call):
            out = replace(e, args=tuple(rebuild(a) for a in e.args))
        else:
            out = e
        memo[id(e)] = out
        return out

    return rebuild(rule), new_in, out_type.with_shape(new_out or [1])
