"""Quantization: QuantizeLinear and DequantizeLinear (per-tensor and per-axis)."""

from __future__ import annotations
