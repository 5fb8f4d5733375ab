"""A user pass with a classic bug, for the demo: it moves a ReLU below a mean pooling, as one may
below a max pooling (max and relu commute; a mean and relu do not: the mean of [-3, 1] is -1,
relu of it 0, but the mean of their relus is 0.5). A gated compile must refuse it."""

from __future__ import annotations

from dataclasses import dataclass

from cuvil.ir import Builder
from cuvil.ir.values import Value
from cuvil.passes import Contract, ValueRewrite


@dataclass(frozen=True)
class PushReluBelowPooling(ValueRewrite):
    """reduce_mean(relu(x)) -> relu(reduce_mean(x)): wrong, see the module's docstring."""

    name = "push-relu-below-pooling"
    contract = Contract.EXACT

    def rewrite(self, v: Value, operands: list[Value], b: Builder) -> Value | None:
        if v.op == "reduce_mean" and operands[0].op == "relu":
            return b.relu(b.reduce_mean(operands[0].operands[0], **v.attr_dict))
        return None
