"""Optimization passes and the pass manager.

A pass is a frozen dataclass with a kebab-case ``name``, a ``contract`` and
``run(module) -> PassResult``; ``register`` makes it usable in pipelines. ``ValueRewrite``
rewrites value by value; ``cuvil.passes.rewrite`` holds rewrites written as data (patterns and
rules, see ``cuvil/passes/canonicalize.py``). ``docs/writing-a-pass.md`` is the guide.
"""

from cuvil.passes.base import Contract, FunctionPass, Pass, PassResult, register
from cuvil.passes.manager import PassManager, PipelineResult, parse_pipeline, run_pipeline
from cuvil.passes.value_rewrite import ValueRewrite

__all__ = ["Contract", "FunctionPass", "Pass", "PassManager", "PassResult", "PipelineResult", "ValueRewrite",
           "parse_pipeline", "register", "run_pipeline"]
