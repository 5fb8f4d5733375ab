"""Optimization passes and the pass manager.

A pass is a frozen dataclass with a kebab-case ``name``, a ``contract`` and
``run(module) -> PassResult``; ``register`` makes it usable in pipelines. See
``cuvil/passes/canonicalize.py`` for rewrites written as data.
"""

from cuvil.passes.base import Contract, FunctionPass, Pass, PassResult, register
from cuvil.passes.manager import PassManager, PipelineResult, parse_pipeline, run_pipeline

__all__ = ["Contract", "FunctionPass", "Pass", "PassManager", "PassResult", "PipelineResult", "parse_pipeline",
           "register", "run_pipeline"]
