"""ONNX losses and optimizer steps (ai.onnx.preview.training) as plain arithmetic on the current tensors."""

from __future__ import annotations

from cuvil.frontend.onnx_node import NodeCtx, onnx_op
from cuvil.frontend.onnx_ops.blocks import cast_to, reshape_to, scalar, unsqueeze
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.values import Value


def _nll(ctx: NodeCtx, logp: Value, target: Value, weight: Value | None) -> Value:
    """-logp[n, target[n, ...], ...] weighted, with ignore_index and the reduction applied."""
    b = ctx.b
    dt = logp.dtype
    reduction = ctx.attr_str("reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        raise ctx.unsupported(f"reduction {reduction!r}")
    ignore = ctx.attr_int("ignore_index", None)
    tgt = target
    valid: Value | None = None
    if ignore is not None:
        ign = scalar(b, ignore, target.dtype)
        valid = b.not_equal(target, ign)
        tgt = b.where(valid, target, scalar(b, 0, target.dtype))  # any in-range class; its loss is zeroed
    picked = reshape_to(b, b.gather_elements(logp, unsqueeze(b, tgt, 1), axis=1), list(target.shape))
    w: Value | None = b.gather(weight, tgt, axis=0) if weight is not None else None
    if valid is not None:
        w = b.where(valid, w if w is not None else scalar(b, 1.0, dt), scalar(b, 0.0, dt))
    loss = b.neg(picked)
    if w is not None:
        loss = b.mul(loss, w)
    if reduction == "none":
        return loss
    total = b.reduce_sum(loss, axes=[], keepdims=False)
    if reduction == "sum":
        return total
    if w is None:
        return b.reduce_mean(loss, axes=[], keepdims=False)
    denom = b.reduce_sum(b.expand(w, shape=list(loss.shape)) if w.shape != loss.shape else w, axes=[],
                         keepdims=False)
    return b.div(total, denom)


@onnx_op("NegativeLogLikelihoodLoss", emits=("gather_elements", "gather", "where", "not_equal", "neg", "mul",
                                             "reduce_sum", "reduce_mean", "div", "reshape"))
def nll_loss(ctx: NodeCtx) -> Value:
    return _nll(ctx, ctx.input(0), ctx.input(1), ctx.input(2) if ctx.has_input(2) else None)


@onnx_op("SoftmaxCrossEntropyLoss", emits=("log_softmax", "gather_elements", "gather", "where", "not_equal",
                                           "neg", "mul", "reduce_sum", "reduce_mean", "div", "reshape"))
def softmax_cross_entropy_loss(ctx: NodeCtx) -> list[Value]:
    logp = ctx.b.log_softmax(ctx.input(0), axis=1)
    loss = _nll(ctx, logp, ctx.input(1), ctx.input(2) if ctx.has_input(2) else None)
    return [loss, logp][:max(1, ctx.num_outputs)]


_TRAINING = "ai.onnx.preview.training"


def _optimizer_groups(ctx: NodeCtx, per_tensor: int) -> tuple[Value, Value, list[list[Value]]]:
    """R, T and, for each optimized tensor, its ``per_tensor`` inputs (X, G, then the states)."""
    n_rest = len(ctx.inputs) - 2
    if n_rest <= 0 or n_rest % per_tensor:
        raise ctx.unsupported(f"expected 2 + {per_tensor}*n inputs, got {len(ctx.inputs)}")
    n = n_rest // per_tensor
    groups = [[ctx.input(2 + j * n + i) for j in range(per_tensor)] for i in range(n)]
    return ctx.input(0), ctx.input(1), groups


def _regularized(b: Builder, x: Value, g: Value, coefficient: float) -> Value:
    return g if coefficient == 0.0 else b.add(b.mul(scalar(b, coefficient, x.dtype), x), g)


@onnx_op("Adagrad", domain=_TRAINING, emits=("mul", "add", "sub", "div", "sqrt", "cast"))
def adagrad(ctx: NodeCtx) -> list[Value]:
    b = ctx.b
    r, t, groups = _optimizer_groups(ctx, 3)
    decay, eps = ctx.attr_float("decay_factor", 0.0), ctx.attr_float("epsilon", 0.0)
    norm = ctx.attr_float("norm_coefficient", 0.0)
    xs, hs = [], []
    for x, g, h in groups:
        dt = x.dtype
        rate = b.div(cast_to(b, r, dt), b.add(scalar(b, 1.0, dt), b.mul(cast_to(b, t, dt), scalar(b, decay, dt))))
        gr = _regularized(b, x, g, norm)
        h_new = b.add(h, b.mul(gr, gr))
        xs.append(b.sub(x, b.div(b.mul(rate, gr), b.add(b.sqrt(h_new), scalar(b, eps, dt)))))
        hs.append(h_new)
    return xs + hs


@onnx_op("Momentum", domain=_TRAINING, emits=("mul", "add", "sub", "greater", "where", "cast"))
def momentum(ctx: NodeCtx) -> list[Value]:
    b = ctx.b
    r, t, groups = _optimizer_groups(ctx, 3)
    alpha, beta = ctx.attr_float("alpha"), ctx.attr_float("beta")
    norm = ctx.attr_float("norm_coefficient", 0.0)
    mode = ctx.attr_str("mode", "standard")
    if mode not in ("standard", "nesterov"):
        raise ctx.unsupported(f"mode {mode!r}")
    xs, vs = [], []
    for x, g, v in groups:
        dt = x.dtype
        gr = _regularized(b, x, g, norm)
        # the first step (T == 0) takes the whole gradient
        beta_t = b.where(b.greater(t, scalar(b, 0, t.dtype)), scalar(b, beta, dt), scalar(b, 1.0, dt))
        v_new = b.add(b.mul(scalar(b, alpha, dt), v), b.mul(beta_t, gr))
        step = v_new if mode == "standard" else b.add(gr, b.mul(scalar(b, alpha, dt), v_new))
        xs.append(b.sub(x, b.mul(cast_to(b, r, dt), step)))
        vs.append(v_new)
    return xs + vs


@onnx_op("Adam", domain=_TRAINING, emits=("mul", "add", "sub", "div", "sqrt", "pow", "greater", "where", "cast"))
def adam(ctx: NodeCtx) -> list[Value]:
    b = ctx.b
    r, t, groups = _optimizer_groups(ctx, 4)
    alpha, beta = ctx.attr_float("alpha", 0.9), ctx.attr_float("beta", 0.999)
    eps = ctx.attr_float("epsilon", 0.0)
    norm, post = ctx.attr_float("norm_coefficient", 0.0), ctx.attr_float("norm_coefficient_post", 0.0)
    xs, vs, hs = [], [], []
    for x, g, v, h in groups:
        dt = x.dtype

        def c(value: float, dt: DType = dt) -> Value:
            return scalar(b, value, dt)

        gr = _regularized(b, x, g, norm)
        v_new = b.add(b.mul(c(alpha), v), b.mul(c(1.0 - alpha), gr))
        h_new = b.add(b.mul(c(beta), h), b.mul(c(1.0 - beta), b.mul(gr, gr)))
        tf = cast_to(b, t, dt)
        # bias correction from the second step on: R * sqrt(1 - beta^T) / (1 - alpha^T)
        corrected = b.div(b.mul(cast_to(b, r, dt), b.sqrt(b.sub(c(1.0), b.pow(c(beta), tf)))),
                          b.sub(c(1.0), b.pow(c(alpha), tf)))
        rate = b.where(b.greater(t, scalar(b, 0, t.dtype)), corrected, cast_to(b, r, dt))
        x_new = b.sub(x, b.mul(rate, b.div(v_new, b.add(b.sqrt(h_new), c(eps)))))
        xs.append(b.mul(c(1.0 - post), x_new) if post else x_new)
        vs.append(v_new)
        hs.append(h_new)
    return xs + vs + hs
