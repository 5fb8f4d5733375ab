"""ONNX quant converters."""

from __future__ import annotations
