"""ONNX converters, one module per op family. Importing this package registers them all.

The composite families (attention, contrib, recurrent, training, spectral, grid, control, composites)
add no catalogue op: they spell ONNX ops out in matmul/softmax/where/reshape/..., so the
verifier and the code generator see only ops they already understand; ``sequence``
resolves sequences and optionals while the model is imported (CIR values are tensors).
Not supported: Bernoulli, Multinomial and Random* (their results are random). ``fold`` is no
family: it evaluates shape computations on symbolic dims for the importer's compile-time values.
"""

from cuvil.frontend.onnx_ops import (  # noqa: F401
    attention,
    composites,
    contrib,
    control,
    elementwise,
    grid,
    index,
    linalg,
    ml,
    nn,
    quant,
    quant_contrib,
    recurrent,
    reduce,
    sequence,
    shape,
    spectral,
    training,
)
