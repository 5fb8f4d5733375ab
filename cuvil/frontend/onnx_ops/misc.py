"""ONNX misc converters."""

from __future__ import annotations
