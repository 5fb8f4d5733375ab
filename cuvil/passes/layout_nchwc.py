"""Blocked activation layout for convolutions (NCHW -> NCHW{c}c), as a layout plan for the backend.

CIR's ``conv`` is defined on NC* data and sums over input channels in one reduction; a
conv over blocked data written with existing ops (a conv over an extra spatial axis of
size c) would sum the same products in a different order, which is not bit-exact. So
the values stay as they are and this pass records in ``Module.metadata["layout-nchwc"]``
which values the backend keeps blocked: every conv whose channel counts divide by the
block (and every channel-preserving op downstream of one: elementwise ops with per-channel
or scalar operands, pooling, batch_norm, fused epilogues), each conv's weight layout, and
the reorders at the boundaries of those regions. No value changes, so it is ``exact``.

The LLVM backend does not read this plan: it chooses a layout per value from the kernels it picked, keeping
channels-last (``[N, H, W, C]``) the activations that only its position-row convolutions produce and read
(:mod:`cuvil.codegen.activation_layout`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from cuvil.ir.hashing import structural_hash
from cuvil.ir.module import Function, Module
from cuvil.ir.opdef import get_op
from cuvil.ir.region import Region
from cuvil.ir.values import Value
from cuvil.passes.base import Contract, Pass, PassResult, register

METADATA_KEY = "layout-nchwc"
_SPATIAL = "DHW"
_CHANNEL_PRESERVING = ("max_pool", "avg_pool", "lp_pool", "batch_norm")


def conv_of(v: Value) -> Value | None:
    """The conv computed by ``v``: itself, or the anchor of a fused epilogue."""
    if v.op == "conv":
        return v
    if v.op == "fused" and v.attr("kind") == "epilogue":
        body: Region = v.attr("body")
        anchors = [u for u in body.ops() if u.op == "conv"]
        return anchors[0] if len(anchors) == 1 else None
    return None


def _spatial(rank: int) -> str:
    return _SPATIAL[-(rank - 2):] if rank > 2 else ""


def activation_layout(rank: int, block: int) -> str:
    return f"NC{_spatial(rank)}{block}c"


def weight_layout(rank: int, block: int, blocked_input: bool) -> str:
    inner = f"{block}i{block}o" if blocked_input else f"{block}o"
    return f"OI{_spatial(rank)}{inner}"


def _channels(v: Value) -> int | None:
    if v.type.rank < 3 or not isinstance(v.type.shape[1], int):
        return None
    return int(v.type.shape[1])


def _is_side_operand(o: Value, out: Value) -> bool:
    """A per-channel or scalar operand: broadcast over everything but (at most) the channel axis."""
    rank = out.type.rank
    if o.type.rank > rank:
        return False
    pad = (1,) * (rank - o.type.rank) + tuple(o.type.shape)
    return all(d == 1 for k, d in enumerate(pad) if k != 1) and pad[1] in (1, out.type.shape[1])


def _full(o: Value, v: Value) -> bool:
    """``o`` is an activation of ``v``'s shape (any dtype)."""
    return tuple(o.type.shape) == tuple(v.type.shape)


def _conv_input(site: Value) -> Value:
    """The value a conv site reads as its activation (through a fused epilogue's arguments)."""
    conv = conv_of(site)
    assert conv is not None
    if site.op == "conv":
        return site.operand("x")
    body: Region = site.attr("body")
    return site.operands[body.params.index(conv.operand("x"))]


@register
@dataclass(frozen=True)
class LayoutNchwc(Pass):
    name = "layout-nchwc"
    contract = Contract.EXACT
    enters_loops = False  # its plan spans the whole function
    description = "plan a blocked NCHW{c}c activation layout around convolutions (recorded for the backend)"

    block: int = 16

    def run(self, module: Module) -> PassResult:
        plans = {fn.name: p for fn in module.functions if (p := self.plan(fn))["sites"]}
        if not plans:
            return PassResult(module, False)
        text = json.dumps({"version": 1, "block": self.block, "functions": plans}, sort_keys=True)
        if module.metadata.get(METADATA_KEY) == text:
            return PassResult(module, False)
        meta = {**module.metadata, METADATA_KEY: text}
        notes = tuple(f"@{n}: {len(p['sites'])} blocked convs, {len(p['reorders'])} reorders" for n, p in plans.items())
        return PassResult(Module(module.functions, module.constants, meta), True, notes)

    def _divisible(self, v: Value) -> bool:
        c = _channels(v)
        return c is not None and c % self.block == 0

    def _site(self, v: Value) -> bool:
        """A conv (or conv epilogue) whose output channels divide by the block; grouped convs
        only when every group is a whole number of blocks or the conv is depthwise."""
        conv = conv_of(v)
        if conv is None or not conv.dtype.is_float or conv.type.shape != v.type.shape or not self._divisible(conv):
            return False
        groups, x = conv.attr("groups"), conv.operand("x")
        if groups == 1:
            return True
        c_in = _channels(x)
        depthwise = c_in is not None and groups == c_in == _channels(conv)
        return depthwise or (c_in is not None and (c_in // groups) % self.block == 0
                             and int(conv.type.shape[1]) // groups % self.block == 0)

    def _follows(self, v: Value, blocked: set[Value]) -> bool:
        """A channel-preserving op that may stay blocked when an activation operand of it is blocked."""
        if v.is_param or v.is_const or not self._divisible(v):
            return False
        if v.op in _CHANNEL_PRESERVING:
            return v.operands[0] in blocked
        if get_op(v.op).family != "elementwise" and not (v.op == "fused" and v.attr("kind") == "elementwise"):
            return False
        acts = [o for o in v.operands if _full(o, v)]
        return any(o in blocked for o in acts) and all(_is_side_operand(o, v) for o in v.operands if o not in acts)

    def _activation_operands(self, v: Value) -> list[Value]:
        if conv_of(v) is not None:
            x = _conv_input(v)
            return list(dict.fromkeys([x] + [o for o in v.operands if _full(o, v)]))
        if v.op in _CHANNEL_PRESERVING:
            return [v.operands[0]]
        return list(dict.fromkeys(o for o in v.operands if _full(o, v)))

    def plan(self, fn: Function) -> dict[str, Any]:
        """Sites, blocked values, and reorders, each value named by its index in ``fn.values()``."""
        values = fn.values()
        order = {v: t for t, v in enumerate(values)}
        blocked: set[Value] = set()
        sites: list[dict[str, Any]] = []
        for v in values:
            if self._site(v):
                blocked.add(v)
                conv = conv_of(v)
                assert conv is not None
                x = conv.operand("x")
                blocked_input = self._divisible(x)
                sites.append({"index": order[v], "op": v.op, "hash": structural_hash(v),
                              "in_channels": _channels(x), "out_channels": _channels(conv),
                              "groups": conv.attr("groups"),
                              "input": activation_layout(x.type.rank, self.block) if blocked_input else "plain",
                              "output": activation_layout(v.type.rank, self.block),
                              "weights": weight_layout(v.type.rank, self.block, blocked_input)})
            elif self._follows(v, blocked):
                blocked.add(v)
        users = fn.users()
        to_blocked: dict[Value, list[int]] = defaultdict(list)
        to_plain: list[dict[str, Any]] = []
        for v in values:
            if v not in blocked:
                continue
            plain_users = sorted({order[u] for u in users.get(v, []) if u not in blocked})
            if plain_users or v in fn.results:
                to_plain.append({"value": order[v], "to": "plain", "users": plain_users,
                                 "result": v in fn.results})
            for o in self._activation_operands(v):
                if o not in blocked and self._divisible(o):
                    to_blocked[o].append(order[v])
        reorders = to_plain + [{"value": order[o], "to": "blocked", "users": sorted(set(us)), "result": False}
                               for o, us in to_blocked.items()]
        return {"sites": sites, "blocked": sorted(order[v] for v in blocked),
                "reorders": sorted(reorders, key=lambda r: (r["value"], r["to"]))}
