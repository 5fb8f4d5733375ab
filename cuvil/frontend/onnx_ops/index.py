"""ONNX index converters."""

from __future__ import annotations
