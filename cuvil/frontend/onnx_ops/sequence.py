"""ONNX sequences and optionals, resolved while the model is imported.

CIR values are tensors. A sequence whose length the import knows (built by SequenceConstruct,
SplitToSequence with a static split, SequenceInsert at static positions, or fed in a form the
import is given) is kept as the list of its elements (:class:`SeqValue`); an optional as its
content or nothing (:class:`OptValue`). Reading an element at a static position, a sequence's
length, or whether an optional holds a value then costs nothing at run time, and every tensor
computed from them is ordinary CIR. A position or split that only a run knows is refused.
"""

from __future__ import annotations

import numpy as np

from cuvil.frontend.onnx_node import Entity, NodeCtx, OptValue, SeqValue, onnx_dtype, onnx_op
from cuvil.frontend.onnx_ops.blocks import MAX_UNROLL, concat, scalar, stack
from cuvil.ir.dtypes import DType
from cuvil.ir.opdef import norm_axis
from cuvil.ir.values import Value


def _position(ctx: NodeCtx, i: int, length: int, inclusive: bool) -> int:
    """A static position (negative counts from the end) within ``[-length, length)``, or up to
    ``length`` itself where the op may append."""
    raw = np.asarray(ctx.static(i))
    if raw.size != 1 or raw.dtype.kind not in "iu":
        raise ctx.unsupported(f"the position must be one integer, got {raw.dtype}{list(raw.shape)}")
    pos = int(raw.reshape(()))
    hi = length + 1 if inclusive else length
    if not -length <= pos < hi:
        raise ctx.unsupported(f"position {pos} is outside a sequence of {length} tensors")
    return pos + length if pos < 0 else pos


def _elem_dtype(ctx: NodeCtx, seq: SeqValue, x: Value) -> None:
    if x.dtype is not seq.dtype:
        raise ctx.unsupported(f"a {x.dtype.value} tensor cannot join a sequence of {seq.dtype.value}")


@onnx_op("SequenceEmpty", emits=())
def sequence_empty(ctx: NodeCtx) -> SeqValue:
    code = ctx.attr_int("dtype", 1)
    return SeqValue((), onnx_dtype(code, ctx.location))


@onnx_op("SequenceConstruct", emits=())
def sequence_construct(ctx: NodeCtx) -> SeqValue:
    xs = [ctx.input(i) for i in range(len(ctx.inputs))]
    if not xs:
        raise ctx.unsupported("no inputs")
    seq = SeqValue(tuple(xs), xs[0].dtype)
    for x in xs:
        _elem_dtype(ctx, seq, x)
    return seq


@onnx_op("SequenceAt", emits=())
def sequence_at(ctx: NodeCtx) -> Value:
    seq = ctx.sequence(0)
    return seq.elems[_position(ctx, 1, len(seq.elems), inclusive=False)]


@onnx_op("SequenceInsert", emits=())
def sequence_insert(ctx: NodeCtx) -> SeqValue:
    seq, x = ctx.sequence(0), ctx.input(1)
    _elem_dtype(ctx, seq, x)
    pos = _position(ctx, 2, len(seq.elems), inclusive=True) if ctx.has_input(2) else len(seq.elems)
    if len(seq.elems) >= MAX_UNROLL:
        raise ctx.unsupported(f"a sequence of more than {MAX_UNROLL} tensors")
    return SeqValue((*seq.elems[:pos], x, *seq.elems[pos:]), seq.dtype)


@onnx_op("SequenceErase", emits=())
def sequence_erase(ctx: NodeCtx) -> SeqValue:
    seq = ctx.sequence(0)
    if not seq.elems:
        raise ctx.unsupported("erasing from an empty sequence")
    pos = _position(ctx, 1, len(seq.elems), inclusive=False) if ctx.has_input(1) else len(seq.elems) - 1
    return SeqValue((*seq.elems[:pos], *seq.elems[pos + 1:]), seq.dtype)


@onnx_op("SequenceLength", emits=())
def sequence_length(ctx: NodeCtx) -> Value:
    return scalar(ctx.b, len(ctx.sequence(0).elems), DType.i64)


@onnx_op("SplitToSequence", emits=("split", "reshape"))
def split_to_sequence(ctx: NodeCtx) -> SeqValue:
    """Pieces of a static dim: sizes given by ``split`` (one size: equal chunks, the last one
    shorter), or pieces of 1 (squeezed unless ``keepdims``)."""
    x = ctx.input(0)
    axis = norm_axis(ctx.attr_int("axis", 0), x.type.rank)
    d = x.shape[axis]
    if not isinstance(d, int):
        raise ctx.unsupported(f"splitting the symbolic dim {d} makes a sequence of run-time length")
    squeeze = False
    if ctx.has_input(1):
        split = np.asarray(ctx.static(1))
        if split.dtype.kind not in "iu" or split.ndim > 1 or (split < 0).any():
            raise ctx.unsupported(f"split must hold non-negative integers, got {split.tolist()}")
        if split.ndim == 0:
            chunk = int(split)
            if chunk <= 0:
                raise ctx.unsupported(f"a chunk size of {chunk}")
            sizes = [min(chunk, d - k) for k in range(0, d, chunk)]
        else:
            sizes = [int(s) for s in split]
            if sum(sizes) != d:
                raise ctx.unsupported(f"split sizes {sizes} do not add up to the dim {d}")
    else:
        sizes = [1] * d
        squeeze = not ctx.attr_int("keepdims", 1)
    if len(sizes) > MAX_UNROLL:
        raise ctx.unsupported(f"a sequence of more than {MAX_UNROLL} tensors")
    pieces = [x] if len(sizes) == 1 else \
        [ctx.b.split(x, axis=axis, sizes=sizes, index=k) for k in range(len(sizes))]
    if squeeze:
        shape = [s for k, s in enumerate(x.shape) if k != axis]
        pieces = [ctx.b.reshape(p, shape=shape) for p in pieces]
    return SeqValue(tuple(pieces), x.dtype)


@onnx_op("ConcatFromSequence", emits=("concat", "reshape"))
def concat_from_sequence(ctx: NodeCtx) -> Value:
    seq = ctx.sequence(0)
    if not seq.elems:
        raise ctx.unsupported("concatenating an empty sequence")
    rank = seq.elems[0].type.rank
    if ctx.attr_int("new_axis", 0):
        return stack(ctx.b, seq.elems, norm_axis(ctx.attr_int("axis"), rank + 1))
    return concat(ctx.b, seq.elems, norm_axis(ctx.attr_int("axis"), rank))


@onnx_op("SequenceMap", emits=())
def sequence_map(ctx: NodeCtx) -> list[SeqValue]:
    """The body once per position of the sequences (inlined), each tensor input the same every time."""
    body = ctx.attr("body")
    ins = [ctx.entity(i) for i in range(len(ctx.inputs))]
    lengths = {len(e.elems) for e in ins if isinstance(e, SeqValue)}
    if not isinstance(ins[0], SeqValue) or len(lengths) != 1:
        raise ctx.unsupported("the first input must be a sequence, and all sequences of one length")
    (n,) = lengths
    ctx.imp.charge_unroll(n, ctx.location)
    per_step = [ctx.imp.import_subgraph(body, [e.elems[k] if isinstance(e, SeqValue) else e for e in ins])
                for k in range(n)]
    outs: list[SeqValue] = []
    for j, vi in enumerate(body.output):
        elems = tuple(step[j] for step in per_step)
        if not all(isinstance(v, Value) for v in elems):
            raise ctx.unsupported("a body output that is not a tensor")
        dtype = onnx_dtype(vi.type.tensor_type.elem_type, ctx.location) if not elems else elems[0].dtype
        outs.append(SeqValue(elems, dtype))  # type: ignore[arg-type]
    return outs


@onnx_op("Optional", emits=())
def optional(ctx: NodeCtx) -> OptValue:
    return OptValue(ctx.entity(0) if ctx.has_input(0) else None)  # type: ignore[arg-type]


@onnx_op("OptionalHasElement", emits=())
def optional_has_element(ctx: NodeCtx) -> Value:
    present = ctx.has_input(0) and _content(ctx.entity(0)) is not None
    return scalar(ctx.b, present, DType.bool)


@onnx_op("OptionalGetElement", emits=())
def optional_get_element(ctx: NodeCtx) -> Entity:
    content = _content(ctx.entity(0))
    if content is None:
        raise ctx.unsupported("the optional is empty")
    return content


def _content(e: Entity) -> Value | SeqValue | None:
    """An optional's content; a tensor or sequence stands for itself (opset 18 accepts them)."""
    return e.content if isinstance(e, OptValue) else e
