"""Element types of CIR tensors and their numpy counterparts."""

from __future__ import annotations

import enum

import ml_dtypes
import numpy as np


class DType(enum.Enum):
    """A CIR element type; the value is its spelling in the text format."""

    f64 = "f64"
    f32 = "f32"
    f16 = "f16"
    bf16 = "bf16"
    i64 = "i64"
    i32 = "i32"
    i16 = "i16"
    i8 = "i8"
    u64 = "u64"
    u32 = "u32"
    u16 = "u16"
    u8 = "u8"
    bool = "bool"
    # narrow storage types (ONNX float8/float4/int4/int2): values are stored narrow and
    # computed on by widening (casts and (de)quantization are their main users)
    f8e4m3fn = "f8e4m3fn"
    f8e4m3fnuz = "f8e4m3fnuz"
    f8e5m2 = "f8e5m2"
    f8e5m2fnuz = "f8e5m2fnuz"
    f8e8m0 = "f8e8m0"
    f4e2m1 = "f4e2m1"
    i4 = "i4"
    u4 = "u4"
    i2 = "i2"
    u2 = "u2"

    def __repr__(self) -> str:
        return f"DType.{self.value}"

    def __str__(self) -> str:
        return self.value

    @property
    def np(self) -> np.dtype:
        return _TO_NUMPY[self]

    @property
    def is_float(self) -> bool:
        return self in _FLOATS

    @property
    def is_int(self) -> bool:
        return not self.is_float and self is not DType.bool

    @property
    def is_signed(self) -> bool:
        return (self.is_float and self is not DType.f8e8m0) or \
            self in (DType.i64, DType.i32, DType.i16, DType.i8, DType.i4, DType.i2)

    @property
    def is_narrow(self) -> bool:
        """A storage-only type narrower than 16 bits of float or 8 bits of int."""
        return self in _NARROW

    @property
    def min_value(self) -> float | int:
        """The smallest finite value (for floats: the most negative finite)."""
        if self is DType.bool:
            return 0
        return int(ml_dtypes.iinfo(self.np).min) if self.is_int else float(ml_dtypes.finfo(self.np).min)

    @property
    def max_value(self) -> float | int:
        """The largest finite value."""
        if self is DType.bool:
            return 1
        return int(ml_dtypes.iinfo(self.np).max) if self.is_int else float(ml_dtypes.finfo(self.np).max)

    @property
    def bits(self) -> int:
        return _BITS.get(self, 8 if self is DType.bool else self.np.itemsize * 8)

    @staticmethod
    def parse(text: str) -> DType:
        return DType(text)

    @staticmethod
    def from_numpy(dtype: np.dtype | type) -> DType:
        dt = np.dtype(dtype)
        try:
            return _FROM_NUMPY[dt]
        except KeyError:
            from cuvil.errors import InputError

            raise InputError(f"numpy dtype {dt} has no CIR counterpart",
                             hint="supported: " + ", ".join(d.value for d in DType)) from None


_TO_NUMPY: dict[DType, np.dtype] = {
    DType.f64: np.dtype(np.float64),
    DType.f32: np.dtype(np.float32),
    DType.f16: np.dtype(np.float16),
    DType.bf16: np.dtype(ml_dtypes.bfloat16),
    DType.i64: np.dtype(np.int64),
    DType.i32: np.dtype(np.int32),
    DType.i16: np.dtype(np.int16),
    DType.i8: np.dtype(np.int8),
    DType.u64: np.dtype(np.uint64),
    DType.u32: np.dtype(np.uint32),
    DType.u16: np.dtype(np.uint16),
    DType.u8: np.dtype(np.uint8),
    DType.bool: np.dtype(np.bool_),
    DType.f8e4m3fn: np.dtype(ml_dtypes.float8_e4m3fn),
    DType.f8e4m3fnuz: np.dtype(ml_dtypes.float8_e4m3fnuz),
    DType.f8e5m2: np.dtype(ml_dtypes.float8_e5m2),
    DType.f8e5m2fnuz: np.dtype(ml_dtypes.float8_e5m2fnuz),
    DType.f8e8m0: np.dtype(ml_dtypes.float8_e8m0fnu),
    DType.f4e2m1: np.dtype(ml_dtypes.float4_e2m1fn),
    DType.i4: np.dtype(ml_dtypes.int4),
    DType.u4: np.dtype(ml_dtypes.uint4),
    DType.i2: np.dtype(ml_dtypes.int2),
    DType.u2: np.dtype(ml_dtypes.uint2),
}
_NARROW = frozenset({DType.f8e4m3fn, DType.f8e4m3fnuz, DType.f8e5m2, DType.f8e5m2fnuz, DType.f8e8m0,
                     DType.f4e2m1, DType.i4, DType.u4, DType.i2, DType.u2})
_FLOATS = frozenset({DType.f64, DType.f32, DType.f16, DType.bf16, DType.f8e4m3fn, DType.f8e4m3fnuz,
                     DType.f8e5m2, DType.f8e5m2fnuz, DType.f8e8m0, DType.f4e2m1})
_BITS = {DType.f4e2m1: 4, DType.i4: 4, DType.u4: 4, DType.i2: 2, DType.u2: 2}
_FROM_NUMPY = {v: k for k, v in _TO_NUMPY.items()}

