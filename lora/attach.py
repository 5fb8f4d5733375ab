"""An adapter put beside the base weights of a CIR module, unmerged, as PEFT runs it: every adapted
linear ``x·Wᵀ`` gains ``s·(x·Aᵀ)·Bᵀ`` (DoRA: the sum rescaled per output by ``m / ‖W + s·B·A‖``),
every adapted embedding ``T[ids]`` gains ``s·Aᵀ[ids]·Bᵀ``, every adapted convolution ``conv(x, W)``
gains ``s·conv(conv(x, A), B)`` (``A`` with the base's kernel, strides and padding, ``B`` 1x1).

Frontends keep no parameter names, so a module's weight is found by its content: the constant
equal to the base module's weight (or its transpose) that a ``matmul`` (linear), an ``embedding`` /
``gather`` (embedding) or a ``conv`` (convolution) reads. A weight found nowhere, or at places that
cannot be told apart, is an error, never a silent skip. The ``merge-low-rank`` pass then merges what this
module adds, with a proof."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import numpy as np

from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Function, Module, content_hash
from cuvil.ir.values import Value
from lora.adapter import Adapter, ModuleTensors
from lora.base import BaseModel, BaseModule
from lora.errors import AdapterError


@dataclass(frozen=True)
class Site:
    """One op of the module that reads an adapted weight."""

    value: Value  # the matmul / embedding / gather, in the module before attaching
    weight_transposed: bool  # the constant holds Wᵀ of the layout the op uses


@dataclass
class Attachment:
    """One adapted module: where its weight is read, and the factors put beside it."""

    module: str
    kind: str
    rank: int
    scale: float
    dora: bool
    sites: list[Site] = field(default_factory=list)
    adapter: str = ""
    attached: list[Value] = field(default_factory=list)
    """Per site, the op reading the base weight in the attached module (its input is the site's input)."""
    factors: set[str] = field(default_factory=set)
    """Content hashes of the low-rank factor constants put beside the weight."""


@dataclass(frozen=True)
class WeightedAdapter:
    """An adapter and the weight its update is multiplied by (PEFT's combination weights)."""

    adapter: Adapter
    weight: float = 1.0


def attach(module: Module, base: BaseModel, adapters: Sequence[Adapter | WeightedAdapter], *,
           only: Collection[str] | None = None) -> tuple[Module, list[Attachment]]:
    """``module`` with every adapter's update added beside the base weights it adapts (``only``: the
    modules of these names, the others left out)."""
    weighted = [a if isinstance(a, WeightedAdapter) else WeightedAdapter(a) for a in adapters]
    if not weighted:
        raise AdapterError("no adapter to attach")
    if len(weighted) > 1 and any(e.magnitude is not None for w in weighted for e in w.adapter.lora_modules):
        raise AdapterError("DoRA adapters cannot be combined with other adapters (PEFT refuses it too)",
                           hint="attach the DoRA adapter alone, or merge it first")
    fn = module.main
    b = Builder(module.constants)
    attachments: list[Attachment] = []
    updates: dict[Value, list[tuple[Attachment, WeightedAdapter, ModuleTensors]]] = {}
    for w in weighted:
        for entry in w.adapter.lora_modules:
            if only is not None and entry.module not in only:
                continue
            att = _locate(fn, module, base, w, entry)
            attachments.append(att)
            for site in att.sites:
                updates.setdefault(site.value, []).append((att, w, entry))
    mapping: dict[Value, Value] = {}
    for v in fn.values():
        site = v if v.is_param or v.is_const else b.op(v.op, *(mapping[o] for o in v.operands), **v.attr_dict)
        new = site
        for att, w, entry in updates.get(v, []):
            att.attached.append(site)
            new = _add_update(b, new, site, att, w, entry, base.modules[entry.module])
        mapping[v] = new
    out = Function(fn.name, fn.params, tuple(mapping[r] for r in fn.results), fn.result_names, fn.constraints)
    functions = tuple(out if f is fn else f for f in module.functions)
    return module.replace(functions=functions, constants=b.constants), attachments


def _locate(fn: Function, module: Module, base: BaseModel, w: WeightedAdapter, entry: ModuleTensors) -> Attachment:
    adapter = w.adapter
    base_module = base.modules.get(entry.module)
    where = f"{adapter.directory}: {entry.module}"
    if base_module is None:
        raise AdapterError(f"the base model has no module {entry.module!r}", location=where,
                           hint="run `cuvil lora check` for the full list of what does not fit")
    if entry.a is None or entry.b is None:
        raise AdapterError(f"{entry.module!r} has {'no lora_A' if entry.a is None else 'no lora_B'}", location=where)
    if entry.magnitude is not None and base_module.kind != "linear":
        raise AdapterError(f"DoRA on {base_module.kind} {entry.module!r} is not supported", location=where)
    att = Attachment(entry.module, base_module.kind, adapter.config.rank(entry.module),
                     adapter.config.scale(entry.module) * w.weight, entry.magnitude is not None,
                     adapter=str(adapter.directory))
    att.sites = _sites(fn, module, base_module)
    for site in att.sites if base_module.kind == "conv" else ():
        _plain_conv(site.value, entry.module, where)
    if base_module.kind == "conv" and base_module.padding_mode != "zeros":
        raise AdapterError(f"{entry.module!r} pads with {base_module.padding_mode!r}; PEFT's lora_A pads the same "
                           "input with zeros, so no merged weight computes its unmerged output", location=where,
                           hint="leave this module out of target_modules")
    if not att.sites:
        raise AdapterError(f"the weight of {entry.module!r} ({base_module.kind}, shape "
                           f"{list(base_module.weight.shape)}) is read by no {_readers(base_module.kind)} of the model",
                           location=where, hint="the model and the base the adapter is checked against must hold "
                                                "the same weights (same dtype, same values)")
    return att


def _readers(kind: str) -> str:
    return {"linear": "matmul", "conv": "conv"}.get(kind, "embedding or gather")


def _plain_conv(v: Value, module: str, where: str) -> None:
    """PEFT runs ``lora_A`` with the base's kernel, strides and padding but no dilation, and cannot merge
    grouped convolutions: such a site's unmerged output is not what a merged weight computes."""
    if v.attr("groups") != 1 or any(d != 1 for d in v.attr("dilations")):
        raise AdapterError(f"{module!r} is a grouped or dilated convolution (groups {v.attr('groups')}, dilations "
                           f"{list(v.attr('dilations'))}): PEFT's LoRA runs it undilated and cannot merge it",
                           location=where, hint="leave this module out of target_modules: PEFT's merged weight "
                                                "would not compute its unmerged output either")


def used_layout(base_module: BaseModule) -> np.ndarray:
    """The weight in the layout its op reads without transposing: ``[in, out]`` for a linear
    (``x @ W_io``), ``[vocab, dim]`` for an embedding."""
    w = np.asarray(base_module.weight)
    if base_module.kind == "linear" and not base_module.fan_in_fan_out:
        return w.T
    return w


def _sites(fn: Function, module: Module, base_module: BaseModule) -> list[Site]:
    used = used_layout(base_module)
    direct, flipped = content_hash(np.ascontiguousarray(used)), content_hash(np.ascontiguousarray(used.T))
    sites = []
    for v in fn.ops():
        operand = _weight_operand(v, base_module.kind)
        if operand is None:
            continue
        const, transposed = operand
        if (const.const_hash, transposed) in ((direct, False), (flipped, True)):
            sites.append(Site(v, transposed))
    return sites


def _weight_operand(v: Value, kind: str) -> tuple[Value, bool] | None:
    """The constant ``v`` reads as a weight of ``kind``, and whether it holds the transpose of the
    layout ``v`` uses."""
    if kind == "linear" and v.op == "matmul" and not v.attr("transpose_a"):
        w, transposed = v.operands[1], bool(v.attr("transpose_b"))
        if w.op == "transpose" and w.type.rank == 2 and tuple(w.attr("perm")) == (1, 0):
            w, transposed = w.operands[0], not transposed
        return (w, transposed) if w.is_const and w.type.rank == 2 else None
    if kind == "conv" and v.op == "conv":
        w = v.operands[1]
        return (w, False) if w.is_const else None
    if kind == "embedding" and (v.op == "embedding" or (v.op == "gather" and v.attr("axis") == 0)):
        table = v.operands[0]
        return (table, False) if table.is_const and table.type.rank == 2 else None
    return None


def _add_update(b: Builder, acc: Value, y: Value, att: Attachment, w: WeightedAdapter, entry: ModuleTensors,
                base_module: BaseModule) -> Value:
    """``acc`` (``y``, the op reading the base weight, with the updates of earlier adapters) plus this
    adapter's update to ``y``; DoRA (never combined) rescales the sum."""
    assert entry.a is not None and entry.b is not None
    dtype = y.dtype
    a_data = np.asarray(w.adapter.array(entry.a), dtype=dtype.np)
    lb = b.const(np.asarray(w.adapter.array(entry.b), dtype=dtype.np))
    s = b.scalar(att.scale, dtype)
    if att.kind == "embedding":  # lora_embedding_A is [r, vocab]: looked up as its transpose
        a_t = b.const(np.ascontiguousarray(a_data.T))
        att.factors.update((a_t.const_hash, lb.const_hash))
        lookup = b.op(y.op, a_t, y.operands[1], **y.attr_dict)
        return b.add(acc, b.mul(b.matmul(lookup, lb, transpose_b=True), s))
    a = b.const(a_data)
    att.factors.update((a.const_hash, lb.const_hash))
    x = y.operands[0]
    if att.kind == "conv":  # lora_A: [r, C, *k] with the base's strides and padding; lora_B: [O, r, 1...]
        rank = len(a_data.shape) - 2
        low = b.conv(b.conv(x, a, strides=y.attr("strides"), pads=y.attr("pads"), dilations=(1,) * rank),
                     lb, strides=(1,) * rank, pads=(0,) * (2 * rank), dilations=(1,) * rank)
        return b.add(acc, b.mul(low, s))
    a2, lb2 = (a.type.shape, lb.type.shape)
    if len(a2) != 2 or len(lb2) != 2:
        raise AdapterError(f"{entry.module!r}: lora_A and lora_B must be matrices, found {list(a2)} and {list(lb2)}")
    out = b.add(acc, b.mul(b.matmul(b.matmul(x, a, transpose_b=True), lb, transpose_b=True), s))
    if entry.magnitude is None:
        return out
    return b.mul(out, _dora_factor(b, y, base_module, a, lb, s, w.adapter.array(entry.magnitude), dtype))


def _dora_factor(b: Builder, y: Value, base_module: BaseModule, a: Value, lb: Value, s: Value,
                 magnitude: np.ndarray, dtype: DType) -> Value:
    """``m / ‖W + s·B·A‖`` per output row, as a constant expression PEFT's DoRA computes the same way."""
    weight = np.asarray(base_module.weight, dtype=dtype.np)
    w_oi = b.const(np.ascontiguousarray(weight.T) if base_module.fan_in_fan_out else weight)
    merged = b.add(w_oi, b.mul(b.matmul(lb, a), s))
    norm = b.sqrt(b.reduce_sum(b.mul(merged, merged), axes=(1,)))
    m = b.const(np.asarray(magnitude, dtype=dtype.np).reshape(-1))
    if m.type.shape != norm.type.shape or norm.type.shape[0] != y.type.shape[-1]:
        raise AdapterError(f"{base_module.name!r}: lora_magnitude_vector has shape {list(m.type.shape)}, expected "
                           f"[{y.type.shape[-1]}] (one per output feature)")
    return b.div(m, norm)
