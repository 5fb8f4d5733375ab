"""A user pass with a classic bug, for the demo: it moves a ReLU below a mean pooling, as one may
below a max pooling (max and relu commute; a mean and relu do not: the mean of [-3, 1] is -1,
relu of it 0, but the mean of their relus is 0.5). A gated compile must refuse it."""

from __future__ import annotations

from dataclasses import dataclass

from cuvil.ir import Builder
from cuvil.ir.module import Function, Module
from cuvil.ir.values import Value
from cuvil.passes import Contract, Pass, PassResult


@dataclass(frozen=True)
class PushReluBelowPooling(Pass):
    """reduce_mean(relu(x)) -> relu(reduce_mean(x)): wrong, see the module's docstring."""

    name = "push-relu-below-pooling"
    contract = Contract.EXACT

    def run(self, module: Module) -> PassResult:
        b = Builder(module.constants)
        fns = []
        for fn in module.functions:
            new: dict[Value, Value] = {}
            for v in fn.values():
                if v.is_param or v.is_const:
                    new[v] = v
                    continue
                ops = [new[o] for o in v.operands]
                if v.op == "reduce_mean" and ops[0].op == "relu":
                    new[v] = b.relu(b.reduce_mean(ops[0].operands[0], **v.attr_dict))
                else:
                    new[v] = b.op(v.op, *ops, **v.attr_dict)
            fns.append(Function(fn.name, fn.params, tuple(new[r] for r in fn.results), fn.result_names,
                                fn.constraints))
        return PassResult(module.replace(functions=fns, constants=b.constants), True)
