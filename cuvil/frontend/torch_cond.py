"""``torch.cond`` (``torch.ops.higher_order.cond``) from an exported program: each branch, a graph
module of its own, imported over the cond's operands, the pair closed into one CIR ``cond``; a
condition known at export time inlines the branch it picks."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from cuvil.errors import UnsupportedOpError
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.region import close_branches
from cuvil.ir.values import Value, walk


class GraphImporter(Protocol):
    """What the cond import needs from the torch importer."""

    b: Builder
    env: dict[Any, Any]

    def resolve(self, a: Any, where: str) -> Any: ...

    def convert_node(self, node: Any) -> None: ...


def import_cond(imp: GraphImporter, node: Any, where: str) -> tuple[Value, ...]:
    """The results of one ``cond`` node (a tuple, as the node's ``getitem`` users read them)."""
    pred, true_gm, false_gm = imp.resolve(node.args[0], where), _module(node, 1), _module(node, 2)
    operands = list(imp.resolve(node.args[3], where))
    if not all(isinstance(o, Value) for o in operands):
        raise UnsupportedOpError("torch.cond over operands that are not tensors", location=where)
    if isinstance(pred, (bool, np.bool_)):  # decided at export time
        return tuple(_branch(imp, true_gm if pred else false_gm, operands, where))
    if not isinstance(pred, Value) or pred.dtype is not DType.bool or pred.type.numel() != 1:
        raise UnsupportedOpError(f"torch.cond's condition must be one bool, got {pred!r}", location=where)
    outer = set(walk([pred, *operands]))
    branches = [_branch(imp, gm, operands, where) for gm in (true_gm, false_gm)]
    if [v.type for v in branches[0]] != [v.type for v in branches[1]]:
        raise UnsupportedOpError(f"torch.cond's branches return {[str(v.type) for v in branches[0]]} and "
                                 f"{[str(v.type) for v in branches[1]]}", location=where)
    regions, captured = close_branches(branches, outer)
    if pred.type.rank:
        pred = imp.b.reshape(pred, shape=[])
    attrs = {"then_body": regions[0], "else_body": regions[1]}
    return tuple(imp.b.cond(pred, *captured, **attrs, output=k) for k in range(len(branches[0])))


def _module(node: Any, k: int) -> Any:
    """The graph module argument ``k`` of ``node`` names (a ``get_attr`` of the graph that holds it)."""
    ref = node.args[k]
    return getattr(ref.graph.owning_module, ref.target)


def _branch(imp: GraphImporter, gm: Any, operands: list[Value], where: str) -> list[Value]:
    """A branch's graph converted with its placeholders bound to ``operands``; its results."""
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    if len(placeholders) != len(operands):
        raise UnsupportedOpError(f"a torch.cond branch takes {len(placeholders)} operands, given {len(operands)}",
                                 location=where)
    for n, v in zip(placeholders, operands, strict=True):
        imp.env[n] = v
    for n in nodes:
        if n.op == "call_function":
            imp.convert_node(n)
    out = next(n for n in nodes if n.op == "output")
    results = [imp.resolve(a, where) for a in out.args[0]]
    if not all(isinstance(r, Value) for r in results):
        raise UnsupportedOpError("a torch.cond branch returns something other than tensors", location=where)
    return results
