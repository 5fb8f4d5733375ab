"""The lowering of each structured op (its results run as one group): a ``loop`` as a real loop, a
``cond`` as a real branch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from cuvil.codegen.cond_kernel import CondKernel
from cuvil.codegen.loop_kernel import LoopKernel
from cuvil.codegen.plan import structured_group_key
from cuvil.codegen.region_steps import StructuredGroup
from cuvil.codegen.sizing import STATIC, Sizing
from cuvil.ir.opdef import get_op
from cuvil.ir.values import Value

StructuredKernel = LoopKernel | CondKernel
_KERNELS: dict[str, type[LoopKernel] | type[CondKernel]] = {"loop": LoopKernel, "cond": CondKernel}


def structured_kernels(steps: Sequence[Value], constants: Mapping[str, np.ndarray],
                       sizing: Sizing = STATIC) -> dict[Value, StructuredKernel]:
    """One lowered loop or cond per group of its results among ``steps``, by the group's first result
    (``sizing``: static shapes, or the shape class whose dims the functions take at run time)."""
    groups: dict[tuple[object, ...], StructuredGroup] = {}
    for v in steps:
        if get_op(v.op).structured:
            groups.setdefault(structured_group_key(v), StructuredGroup({})).members[int(v.attr("output"))] = v
    return {g.first: _KERNELS[g.first.op](g, constants, sizing) for g in groups.values()}
