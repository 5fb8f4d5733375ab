"""Which activations a library keeps channels-last (``[N, H, W, C]`` in memory, the value itself unchanged).

A convolution that takes output positions as its GEMM rows (:class:`~cuvil.codegen.kernels.conv.ConvKernel`'s
``.t`` schedules) computes a tile of positions by output channels. Stored NCHW, each tile row is scattered over
the channel planes (a transpose); stored channels-last it is one contiguous run, and the next such convolution
copies whole rows of every channel into its padded copy. Between two such kernels the layout is theirs to
choose: nothing else reads the value. So a value is kept channels-last exactly when its producer and every
reader are kernels that index it so, and every read of it is one they address by the output element's flat
index (the conv's input, or an epilogue operand of the output's shape read at the element's own place, in a
kernel whose output is channels-last too, so that the flat index means the same element in both). A max pool
(:class:`~cuvil.codegen.kernels.pool.MaxPoolKernel`) may produce such a value too: it reads its input row-major
and stores its output channels-last, a group of channels at a time (ResNet's stem pool feeds its first stage so).
Values that leave the function, views of memory and everything a rule nest or another kernel reads stay
row-major.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, MutableMapping, Sequence

from cuvil.codegen.kernels.base import Kernel
from cuvil.codegen.kernels.conv import ConvKernel
from cuvil.codegen.kernels.epilogue import at_own_place
from cuvil.codegen.kernels.pool import MaxPoolKernel
from cuvil.ir import rules as R
from cuvil.ir.dtypes import DType
from cuvil.ir.rulewalk import walk_exprs
from cuvil.ir.values import Value

CHANNELS_LAST = True
"""Whether libraries keep activations between position-row convolutions channels-last (tests compare both)."""

POOLS = True
"""Whether a max pool may store its output channels-last for position-row convolutions that read it."""

PADDED_OUTPUTS = True
"""Whether a channels-last value with one padding reader is stored in that reader's padded layout (:func:`lay_out`)."""


def _uses(steps: Sequence[Value]) -> dict[Value, list[tuple[Value, int]]]:
    """Each value's readers among ``steps``, with the operand position each reads it at."""
    uses: dict[Value, list[tuple[Value, int]]] = {}
    for u in steps:
        for j, o in enumerate(u.operands):
            uses.setdefault(o, []).append((u, j))
    return uses


def _conv(kernel: Kernel | None) -> ConvKernel | None:
    return kernel if isinstance(kernel, ConvKernel) and kernel.can_be_channels_last() else None


def _pool(kernel: Kernel | None) -> MaxPoolKernel | None:
    return kernel if POOLS and type(kernel) is MaxPoolKernel and kernel.can_store_channels_last() else None


def _loads(kernel: ConvKernel, position: int) -> list[R.Load]:
    return [e for e in walk_exprs(kernel.c.epilogue) if isinstance(e, R.Load) and e.operand == position]


def _read_in_place(kernel: ConvKernel, position: int) -> bool:
    """Whether every load of operand ``position`` in the kernel's epilogue reads the output element's own place."""
    shape = kernel.in_types[position].shape
    return all(at_own_place(e, shape, kernel.out_type.shape) for e in _loads(kernel, position))


def _flat_operands(kernel: ConvKernel) -> set[int]:
    """The operand positions the epilogue reads at the output's flat index (of the output's shape, in place)."""
    return {e.operand for e in walk_exprs(kernel.c.epilogue) if isinstance(e, R.Load) and e.operand != kernel.c.marker
            and tuple(kernel.in_types[e.operand].shape) == tuple(kernel.out_type.shape)}


def channels_last_values(steps: Sequence[Value], tuned: Mapping[Value, Kernel], keep: Collection[Value]
                         ) -> set[Value]:
    """The values (of ``steps``, none in ``keep``) that stay channels-last, by the rules in the module's doc."""
    if not CHANNELS_LAST:
        return set()
    uses = _uses(steps)
    chosen = {v for v in steps if (k := _conv(tuned.get(v)) or _pool(tuned.get(v))) is not None and v not in keep
              and k.out_type.dtype == DType.f32 and k.out_type.rank == 4}

    def readable(v: Value) -> bool:
        for u, j in uses.get(v, []):
            k = _conv(tuned.get(u))
            if k is None:
                return False
            if j == k.c.lhs and k.g.direct:  # a 1x1 conv reads its input in place, row-major
                return False
            if j != k.c.lhs and not _loads(k, j):  # read some other way (a packed operand)
                return False
            if _loads(k, j) and (u not in chosen or not _read_in_place(k, j)):
                return False
        return True

    def consistent(u: Value) -> bool:
        if _pool(tuned.get(u)) is not None:  # it reads no operand at the output's flat index
            return True
        k = _conv(tuned.get(u))
        return k is not None and all(k_op in chosen for j in _flat_operands(k) for k_op in [u.operands[j]])

    changed = True
    while changed:
        kept = {v for v in chosen if readable(v) and consistent(v)}
        changed = kept != chosen
        chosen = kept
    return chosen


def lay_out(steps: Sequence[Value], tuned: MutableMapping[Value, Kernel], keep: Collection[Value]
            ) -> dict[Value, int]:
    """Choose the channels-last values and tell their producers' and readers' kernels (a max pool's kernel is
    replaced by its channels-last one). A value whose one reader is a conv that pads it (stride 1, one copy of
    the plane) and whose producer, a conv not computed in bands, reads no operand at the output's flat index is
    stored straight into that reader's padded layout, and the reader copies nothing: returns those values' sizes
    in bytes (larger than their types'), for the memory plan."""
    chosen = channels_last_values(steps, tuned, keep)
    for v in steps:
        if v in chosen and (pool := _pool(tuned.get(v))) is not None:
            tuned[v] = dataclasses.replace(pool, out_last=True)
            continue
        k = _conv(tuned.get(v))
        if k is None:
            continue
        x = v.operands[k.c.lhs] in chosen and not k.g.direct
        if x or v in chosen:
            k.channels_last(x, v in chosen)
    sizes: dict[Value, int] = {}
    if not PADDED_OUTPUTS:
        return sizes
    uses = _uses(steps)
    for v in steps:
        if v not in chosen or len(uses.get(v, [])) != 1 or (k := _conv(tuned.get(v))) is None or _flat_operands(k):
            continue
        (u, j), = uses[v]
        reader = _conv(tuned.get(u))
        if reader is None or j != reader.c.lhs or _loads(reader, j) or (plane := reader.padded_plane()) is None \
                or not k.can_store_padded(plane):
            continue
        k.store_padded(plane)
        reader.read_padded()
        sizes[v] = 4 * k.g.batch * plane.image_floats
    return sizes
