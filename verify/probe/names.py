"""Where a CIR value came from in the source model: the ONNX node that produced it.

CIR values carry no names (they are hash-consed), so the importer is replayed with a hook
that remembers, for every node output, the value it became. Values are interned, so the
replay's values are the very objects of the module imported before.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cuvil.ir.module import Function
from cuvil.ir.printer import value_names
from cuvil.ir.values import Value, walk


def onnx_node_names(source: str | Path | Any) -> dict[Value, str]:
    """``value -> "node_name (OpType)"`` for the values ONNX nodes produced; empty if it cannot tell."""
    try:
        import onnx

        from cuvil.frontend import onnx_import as oi
    except ImportError:
        return {}
    names: dict[Value, str] = {}

    class Recording(oi.OnnxImporter):
        def convert_node(self, node: Any, table: Any) -> None:
            super().convert_node(node, table)
            label = f"{node.name or '<unnamed>'} ({node.op_type})"
            for out in node.output:
                v = self.env.get(out) if out else None
                if not isinstance(v, Value):  # absent, or a sequence/optional (its tensors are named where made)
                    continue
                for u in walk([v]):
                    if not (u.is_param or u.is_const) and u not in names:
                        names[u] = label

    try:
        model, base = oi.load_onnx(source)
        opsets = {("" if o.domain == "ai.onnx" else o.domain): int(o.version) for o in model.opset_import}
        opsets.setdefault("", onnx.defs.onnx_opset_version())
        try:
            model = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False)
        except Exception:  # shape inference is an optimization of the import, not a requirement
            pass
        Recording(model, base, {}, opsets=opsets).import_graph(model.graph)
    except Exception:  # names are a convenience: a model that imports is never rejected here
        return {}
    return names


def ssa_names(fn: Function) -> dict[Value, str]:
    return value_names(fn)


def describe_origin(v: Value | None, names: Mapping[Value, str], ssa: Mapping[Value, str]) -> str | None:
    if v is None:
        return None
    return names.get(v) or ssa.get(v)
