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

    def __repr__(self) -> str:
        return f"DType.{self.value}"

    def __str__(self) -> str:
        return self.value

    @property
    def np(self) -> np.dtype:
        return _TO_NUMPY[self]

    @property
    def is_float(self) -> bool:
        return self in (DType.f64, DType.f32, DType.f16, DType.bf16)

    @property
    def is_int(self) -> bool:
        return not self.is_float and self is not DType.bool

    @property
    def is_signed(self) -> bool:
        return self.is_float or self in (DType.i64, DType.i32, DType.i16, DType.i8)

    @property
    def bits(self) -> int:
        return 8 if self is DType.bool else self.np.itemsize * 8

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
}
_FROM_NUMPY = {v: k for k, v in _TO_NUMPY.items()}

FLOAT_DTYPES = tuple(d for d in DType if d.is_float)
INT_DTYPES = tuple(d for d in DType if d.is_int)
