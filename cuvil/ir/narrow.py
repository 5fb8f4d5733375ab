"""The meaning of the narrow storage types (float8, float4, int4, int2), written once.

A narrow value is one byte per element (the low 4 or 2 bits for the 4- and 2-bit types). What
a conversion to a narrow float does is defined here from the format alone (exponent and
mantissa widths, bias, which codes are NaN or infinite, what overflow gives), never by
whichever ml_dtypes is installed, which only stores the bytes:

* a float rounds to nearest, ties to even, as if the exponent range were unbounded; a result
  beyond the largest finite value is the format's overflow value (+-inf for f8e5m2, NaN for the
  ``fn``/``fnuz`` types and f8e8m0; f4e2m1, which has neither, saturates to +-6);
* +-inf converts like an overflow; NaN becomes the format's NaN (f4e2m1 has none: NaN becomes a
  zero whose sign is the opposite of the NaN's, as ONNX's reference implementation gives);
* types without a negative zero (``fnuz``) give +0 for results that round to -0; f8e8m0 has no
  sign and no zero (zero and negative values are NaN, positive values below 2^-127 give 2^-127)
  and rounds ties up;
* an integer converts through f64 (one rounding to nearest-even there, then the rule above).

The conversion is one table per format and source width: the bit patterns of the source type at
which the narrow code changes (:func:`steps`). The reference interpreter looks codes up in it
(:func:`encode`), the LLVM lowering emits a binary search over it, and the z3 encoder builds the
same search as a bit-vector term, so the three readers cannot disagree.

Narrow integers: an integer keeps its low bits (ONNX: "discard higher bits"); a float is
truncated toward zero, and NaN, +-inf and values outside the type's range give 0.
"""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass

import numpy as np

from cuvil.ir.dtypes import DType


@dataclass(frozen=True)
class FloatFormat:
    """A narrow float format: ``bits`` wide, sign bit on top when ``signed``."""

    bits: int
    exp_bits: int
    man_bits: int
    bias: int
    signed: bool
    nan: str  # "ieee" (all-ones exponent, nonzero mantissa) | "top" (all ones but the sign) | "0x80" | "0xff" | "none"
    inf: bool  # the all-ones exponent with a zero mantissa is +-inf
    overflow: str  # "inf" | "nan" | "saturate"
    ties: str = "even"  # "even" | "up" (a format without mantissa bits has no even neighbour)

    @property
    def has_negative_zero(self) -> bool:
        return self.signed and self.nan != "0x80"

    @property
    def has_zero(self) -> bool:
        return self.man_bits > 0

    def is_nan(self, code: int) -> bool:
        mag = code & ((1 << (self.bits - 1)) - 1) if self.signed else code
        top_exp = ((1 << self.exp_bits) - 1) << self.man_bits
        if self.nan == "ieee":
            return (mag & top_exp) == top_exp and (mag & ((1 << self.man_bits) - 1)) != 0
        if self.nan == "top":
            return mag == (1 << (self.bits - 1)) - 1
        if self.nan == "0x80":
            return code == 0x80
        if self.nan == "0xff":
            return code == 0xFF
        return False

    def is_inf(self, code: int) -> bool:
        mag = code & ((1 << (self.bits - 1)) - 1)
        return self.inf and mag == ((1 << self.exp_bits) - 1) << self.man_bits

    def value(self, code: int) -> float:
        """The exact value of ``code``; a NaN widens to the quiet NaN with the code's sign bit."""
        negative = self.signed and bool(code >> (self.bits - 1) & 1)
        if self.is_nan(code):
            return math.copysign(math.nan, -1.0 if negative else 1.0)
        if self.is_inf(code):
            return float("-inf") if negative else float("inf")
        e = (code >> self.man_bits) & ((1 << self.exp_bits) - 1)
        m = code & ((1 << self.man_bits) - 1)
        if e == 0 and self.has_zero:  # subnormal
            mag = m * 2.0 ** (1 - self.bias - self.man_bits)
        else:
            mag = (1 + m / (1 << self.man_bits)) * 2.0 ** (e - self.bias)
        if negative:
            return 0.0 if mag == 0 and not self.has_negative_zero else -mag
        return mag

    def nan_code(self, negative: bool) -> int:
        """What a NaN of the given sign converts to."""
        sign = (1 << (self.bits - 1)) if negative and self.signed else 0
        if self.nan == "ieee":
            return sign | (((1 << (self.exp_bits + 1)) - 1) << (self.man_bits - 1))  # quiet NaN
        if self.nan == "top":
            return sign | ((1 << (self.bits - 1)) - 1)
        if self.nan == "0x80":
            return 0x80
        if self.nan == "0xff":
            return 0xFF
        return 0 if negative else 1 << (self.bits - 1)  # no NaN: a zero of the other sign

    def overflow_code(self, negative: bool) -> int:
        """What a finite value beyond the largest finite one (after rounding) converts to."""
        if self.overflow == "nan":
            return self.nan_code(negative)
        sign = (1 << (self.bits - 1)) if negative else 0
        if self.overflow == "inf":
            return sign | (((1 << self.exp_bits) - 1) << self.man_bits)
        return sign | self.max_code

    @property
    def max_code(self) -> int:
        """The positive code with the largest finite value."""
        return max(self.positive_codes(), key=self.value)

    def positive_codes(self) -> list[int]:
        """Codes of the finite values >= 0 (f8e8m0: > 0), ascending by value."""
        top = 1 << (self.bits - 1) if self.signed else 1 << self.bits
        codes = [c for c in range(top) if not self.is_nan(c) and not self.is_inf(c)]
        return sorted(codes, key=self.value)

    def zero_code(self, negative: bool) -> int | None:
        """The code an exact zero of the given sign converts to (None: the format has no zero)."""
        if not self.has_zero:
            return None
        return (1 << (self.bits - 1)) if negative and self.has_negative_zero else 0


FORMATS: dict[DType, FloatFormat] = {
    DType.f8e4m3fn: FloatFormat(8, 4, 3, 7, True, nan="top", inf=False, overflow="nan"),
    DType.f8e4m3fnuz: FloatFormat(8, 4, 3, 8, True, nan="0x80", inf=False, overflow="nan"),
    DType.f8e5m2: FloatFormat(8, 5, 2, 15, True, nan="ieee", inf=True, overflow="inf"),
    DType.f8e5m2fnuz: FloatFormat(8, 5, 2, 16, True, nan="0x80", inf=False, overflow="nan"),
    DType.f8e8m0: FloatFormat(8, 8, 0, 127, False, nan="0xff", inf=False, overflow="nan", ties="up"),
    DType.f4e2m1: FloatFormat(4, 2, 1, 1, True, nan="none", inf=False, overflow="saturate"),
}

INT_RANGES: dict[DType, tuple[int, int]] = {
    DType.i4: (-8, 7), DType.u4: (0, 15), DType.i2: (-2, 1), DType.u2: (0, 3),
}

_UINT = {16: np.uint16, 32: np.uint32, 64: np.uint64}
_FLOAT = {32: np.float32, 64: np.float64}


def _bits_of(x: float, width: int) -> int:
    return struct.unpack("<I" if width == 32 else "<Q", struct.pack("<f" if width == 32 else "<d", x))[0]


# --------------------------------------------------------------------------------------
# narrow floats


@functools.cache
def values(dt: DType) -> np.ndarray:
    """The exact value of every stored byte (float64[256]); a 4-bit type reads its low nibble."""
    fmt = FORMATS[dt]
    mask = (1 << fmt.bits) - 1
    return np.array([fmt.value(byte & mask) for byte in range(256)], dtype=np.float64)


@functools.cache
def widen_table(dt: DType) -> np.ndarray:
    """The f32 bit pattern of each stored byte (uint32[256]); every narrow value is exact in f32."""
    return values(dt).astype(np.float32).view(np.uint32)


def _magnitude_steps(fmt: FloatFormat, negative: bool, width: int) -> list[tuple[int, int]]:
    """``(start, code)`` over the magnitude bits of a source float of ``width`` bits and one sign."""
    if not fmt.signed and negative:
        return [(0, fmt.nan_code(True))]  # no sign: every negative value (and -0) is NaN
    sign = (1 << (fmt.bits - 1)) if negative and fmt.signed else 0
    codes = fmt.positive_codes()
    vals = [fmt.value(c) for c in codes]
    zero = fmt.zero_code(negative)
    out: list[tuple[int, int]] = []
    if zero is None:  # no zero: exactly 0 is NaN, anything positive rounds to at least the smallest value
        out += [(0, fmt.nan_code(negative)), (1, codes[0])]
    else:
        out.append((0, zero))

    def tie_up(upper_code: int) -> bool:
        return fmt.ties == "up" or upper_code % 2 == 0

    for k in range(len(vals) - 1):  # the midpoint between neighbours goes to the even one
        mid = (vals[k] + vals[k + 1]) / 2  # exact in f32: at most man_bits + 1 significant bits
        out.append((_bits_of(mid, width) + (0 if tie_up(codes[k + 1]) else 1), sign | codes[k + 1]))
    top = fmt.max_code
    e = (top >> fmt.man_bits) & ((1 << fmt.exp_bits) - 1)
    beyond = vals[-1] + 2.0 ** (e - fmt.bias - fmt.man_bits) / 2  # half an ulp past the largest value
    out.append((_bits_of(beyond, width) + (0 if tie_up(top + 1) else 1), fmt.overflow_code(negative)))
    inf = _bits_of(float("inf"), width)
    inf_code = (sign | ((1 << fmt.exp_bits) - 1) << fmt.man_bits) if fmt.inf else fmt.overflow_code(negative)
    out += [(inf, inf_code), (inf + 1, fmt.nan_code(negative))]
    return out


@functools.cache
def steps(dt: DType, width: int) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, codes)``: converting a float whose ``width``-bit pattern (f32 or f64) is ``p``
    gives ``codes[k]`` for the last ``starts[k] <= p`` (starts ascend from 0, unsigned)."""
    fmt = FORMATS[dt]
    sign_bit = 1 << (width - 1)
    entries = _magnitude_steps(fmt, False, width)
    entries += [(sign_bit | s, c) for s, c in _magnitude_steps(fmt, True, width)]
    starts: list[int] = []
    codes: list[int] = []
    for s, c in entries:  # merge runs of one code
        if codes and codes[-1] == c:
            continue
        starts.append(s)
        codes.append(c)
    return np.array(starts, dtype=_UINT[width]), np.array(codes, dtype=np.uint8)


def _float_codes(dt: DType, x: np.ndarray) -> np.ndarray:
    width = 64 if x.dtype == np.float64 else 32
    x = x.astype(_FLOAT[width], copy=False)  # f16/bf16 widen exactly to f32
    starts, codes = steps(dt, width)
    return codes[np.searchsorted(starts, x.view(_UINT[width]), side="right") - 1]


# --------------------------------------------------------------------------------------
# narrow integers


def _int_codes(dt: DType, x: np.ndarray) -> np.ndarray:
    return (x.astype(np.int64, copy=False) & ((1 << dt.bits) - 1)).astype(np.uint8)


def int_values(dt: DType, codes: np.ndarray) -> np.ndarray:
    """The integer value of stored bytes (int8): the low bits, sign-extended for signed types."""
    low = codes.astype(np.int16) & ((1 << dt.bits) - 1)
    if dt.is_signed:
        low = np.where(low >= 1 << (dt.bits - 1), low - (1 << dt.bits), low)
    return low.astype(np.int8)


def _float_to_int_codes(dt: DType, x: np.ndarray) -> np.ndarray:
    lo, hi = INT_RANGES[dt]
    with np.errstate(invalid="ignore"):
        t = np.trunc(x.astype(np.float64))
        ok = (t >= lo) & (t <= hi)  # false for NaN and +-inf
    return _int_codes(dt, np.where(ok, t, 0.0).astype(np.int64))


# --------------------------------------------------------------------------------------
# the conversions the interpreter calls


def encode(dt: DType, x: np.ndarray) -> np.ndarray:
    """Convert a numpy array of a wide type (float, integer or bool) to ``dt``'s stored bytes."""
    x = np.asarray(x)
    if x.dtype.kind == "b":
        x = x.astype(np.uint8)
    if dt in FORMATS:
        if x.dtype.kind in "iu":
            x = x.astype(np.float64)
        return _float_codes(dt, x)
    if x.dtype.kind in "iu":
        return _int_codes(dt, x)
    return _float_to_int_codes(dt, x)


def decode(x: np.ndarray) -> np.ndarray:
    """A narrow array as the wide array it means: float32 for narrow floats (exact), int8/uint8
    for narrow integers."""
    dt = DType.from_numpy(x.dtype)
    codes = x.view(np.uint8)
    if dt in FORMATS:
        return widen_table(dt)[codes].view(np.float32)
    out = int_values(dt, codes)
    return out if dt.is_signed else out.astype(np.uint8)
