"""ONNX nn converters."""

from __future__ import annotations
