"""ONNX reduce converters."""

from __future__ import annotations
