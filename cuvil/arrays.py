"""What a caller passes as a tensor (numpy arrays, torch tensors, Python scalars and lists),
turned into numpy arrays in one place: the interpreter and compiled models accept the same
things and refuse the same things with the same coded errors."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from cuvil.errors import InputError

TORCH_VIA_BITS = {"bfloat16": ("int16", "bfloat16"), "float8_e4m3fn": ("uint8", "float8_e4m3fn"),
                  "float8_e5m2": ("uint8", "float8_e5m2"), "float8_e4m3fnuz": ("uint8", "float8_e4m3fnuz"),
                  "float8_e5m2fnuz": ("uint8", "float8_e5m2fnuz"), "float8_e8m0fnu": ("uint8", "float8_e8m0fnu")}
"""torch dtypes numpy lacks: read through an integer view of the same width, then viewed as the
ml_dtypes type (bits kept)."""


def is_torch_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def from_torch(t: Any, name: str = "input") -> np.ndarray:
    """A CPU, dense, C-contiguous numpy view of ``t`` (a copy only when it lives elsewhere)."""
    import torch

    if t.is_meta:
        raise InputError(f"{name} is a meta tensor: it has a shape but no data", location=name,
                         hint="pass a tensor with data (e.g. torch.randn(...)), not one from device='meta'")
    if t.layout != torch.strided:
        raise InputError(f"{name} has the {t.layout} layout; only dense tensors can be passed", location=name,
                         hint="convert it with .to_dense()")
    if t.is_complex() or t.is_quantized:
        raise InputError(f"{name} has dtype {t.dtype}, which no model input has", location=name,
                         hint="pass a real floating-point, integer or bool tensor")
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    dtype = str(t.dtype).removeprefix("torch.")
    if dtype in TORCH_VIA_BITS:
        import ml_dtypes

        bits, np_name = TORCH_VIA_BITS[dtype]
        return t.view(getattr(torch, bits)).numpy().view(getattr(ml_dtypes, np_name))
    try:
        return t.numpy()
    except (TypeError, RuntimeError) as e:
        raise InputError(f"{name} (a torch tensor of dtype {t.dtype}) cannot be read: {e}", location=name,
                         hint="pass a real floating-point, integer or bool tensor") from None


def to_torch(a: np.ndarray) -> Any:
    """A torch tensor sharing ``a``'s memory (bits kept for the dtypes numpy lacks)."""
    import torch

    dtype = a.dtype.name
    if dtype in TORCH_VIA_BITS:
        bits, _ = TORCH_VIA_BITS[dtype]
        return torch.from_numpy(a.view(np.dtype(bits))).view(getattr(torch, dtype))
    return torch.from_numpy(a)


def as_array(x: Any, name: str = "input", *, contiguous: bool = True) -> np.ndarray:
    """``x`` as a numpy array (C-contiguous unless ``contiguous=False``)."""
    if isinstance(x, np.ndarray):
        arr = x
    elif is_torch_tensor(x):
        return from_torch(x, name)
    else:
        try:
            arr = np.asarray(x)
        except (ValueError, TypeError) as e:
            raise InputError(f"{name} is not an array: {e}", location=name,
                             hint="pass a numpy array or a torch tensor of the input's shape") from None
    return np.ascontiguousarray(arr) if contiguous and not arr.flags.c_contiguous else arr
