"""Neural-network ops: convolution, pooling, normalization, softmax."""

from __future__ import annotations
