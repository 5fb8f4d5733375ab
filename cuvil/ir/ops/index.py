"""Data-dependent indexing: gather, scatter, embedding, one-hot, iota."""

from __future__ import annotations
