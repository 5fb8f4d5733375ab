"""The pass manager: runs a pipeline, checks well-formedness after every pass, keeps
before/after snapshots and timings, and calls the gate hook the verifier plugs into."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from cuvil.budget import wall_time_limit
from cuvil.errors import CuvilError, PluginError
from cuvil.ir.hashing import module_hash
from cuvil.ir.module import Module
from cuvil.ir.unroll import module_has_regions
from cuvil.log import logger
from cuvil.passes.base import PASS_REGISTRY, Contract, Pass, PassResult
from cuvil.passes.catalogue import PIPELINES
from cuvil.passes.loop_bodies import enter_loop_bodies


class PipelineError(CuvilError):
    """A pass pipeline that cannot run: an unknown pass, a malformed spec, a pass that broke the IR."""

    code = "CUVIL-PIPELINE"
    default_hint = "run `cuvil opt --list-passes` for the available passes"


class GateOutcome(Protocol):
    """What a gate returns: ``accept`` False rolls the pass application back."""

    @property
    def accept(self) -> bool: ...


GateHook = Callable[[Pass, Module, Module], GateOutcome]


@dataclass
class PassRecord:
    name: str
    contract: Contract
    changed: bool
    seconds: float
    ops_before: int
    ops_after: int
    before: Module
    after: Module
    gate: Any = None
    rolled_back: bool = False
    notes: tuple[str, ...] = ()


@dataclass
class PipelineResult:
    module: Module
    records: list[PassRecord] = field(default_factory=list)

    def summary(self) -> list[tuple[str, bool, float, int, int]]:
        return [(r.name, r.changed, r.seconds, r.ops_before, r.ops_after) for r in self.records]


_PLUGIN_TIME_LIMIT = [600.0]


def set_plugin_time_limit(seconds: float) -> None:
    """The time limit of plugin passes in this process (the CLI's --pass-time-limit)."""
    _PLUGIN_TIME_LIMIT[0] = seconds


def is_plugin(p: Pass) -> bool:
    """A pass defined outside Cuvil's own packages (its failures are the user's, not Cuvil's bugs)."""
    return not type(p).__module__.startswith(("cuvil.", "verify."))


def content_changed(before: Module, after: Module) -> bool:
    """Whether ``after`` differs from ``before`` in content (``cuvil.ir.hashing.module_hash``):
    a pass's own ``changed`` flag is never trusted."""
    return after is not before and module_hash(after) != module_hash(before)


def op_count(module: Module) -> int:
    return sum(len(f.ops()) for f in module.functions)


@dataclass
class PassManager:
    """Runs ``passes`` in order. ``gate(pass, before, after)`` sees every application that
    changed the module; ``print_after`` names passes whose output is printed (``"all"`` for every one)."""

    passes: Sequence[Pass]
    gate: GateHook | None = None
    print_after: Sequence[str] = ()
    check: bool = True
    printer: Callable[[str], None] = print
    plugin_time_limit: float | None = None
    """Seconds a pass defined outside Cuvil (a user's plugin) may run before it is stopped
    (None: the process's setting, ``set_plugin_time_limit``)."""

    def _run_one(self, p: Pass, module: Module) -> PassResult:
        """One pass; a plugin runs under its time limit, and what it raises or returns wrong is a
        coded error (a built-in pass that fails is a bug in Cuvil and propagates)."""
        if not is_plugin(p):
            return p.run(module)
        try:
            limit = self.plugin_time_limit if self.plugin_time_limit is not None else _PLUGIN_TIME_LIMIT[0]
            with wall_time_limit(limit, f"pass {p.name}",
                                 hint="a plugin pass that may loop forever; raise --pass-time-limit if it is slow"):
                out = p.run(module)
        except CuvilError:
            raise
        except Exception as e:
            raise PluginError(f"pass {p.name} raised {type(e).__name__}: {e}", location=f"pass {p.name}") from e
        return _checked_result(p, out)

    def run(self, module: Module) -> PipelineResult:
        from cuvil.ir.wellformed import check_module

        result = PipelineResult(module)
        current = module
        for p in self.passes:
            start = time.perf_counter()
            out = self._run_one(p, current)
            if p.enters_loops and module_has_regions(out.module):
                out = replace(out, module=enter_loop_bodies(p, out.module, self._run_one))
            seconds = time.perf_counter() - start
            changed = content_changed(current, out.module)
            if changed != out.changed:
                logger.debug("pass %s said changed=%s; its output's content says %s", p.name, out.changed, changed)
            if self.check and changed:
                try:
                    check_module(out.module)
                except CuvilError as e:
                    raise PipelineError(f"pass {p.name} produced malformed IR: {e.message}",
                                        location=f"pass {p.name}: {e.location or ''}",
                                        hint="this is a bug in the pass") from e
            rec = PassRecord(p.name, p.contract, changed, seconds, op_count(current), op_count(out.module),
                             current, out.module if changed else current, notes=out.notes)
            if changed and self.gate is not None:
                rec.gate = self.gate(p, current, out.module)
                if not rec.gate.accept:
                    rec.rolled_back = True
                    rec.after = current
            logger.debug("pass %-22s %s %.3f s ops %d -> %d%s", p.name, "changed" if changed else "no-op",
                         seconds, rec.ops_before, rec.ops_after, " (rolled back)" if rec.rolled_back else "")
            current = rec.after
            result.records.append(rec)
            if p.name in self.print_after or "all" in self.print_after:
                self.printer(f"// ----- IR after {p.name} -----\n{current}")
        result.module = current
        return result


def _checked_result(p: Pass, out: object) -> PassResult:
    if not isinstance(out, PassResult) or not isinstance(out.module, Module):
        got = type(out.module if isinstance(out, PassResult) else out).__name__
        raise PluginError(f"pass {p.name} returned a {got}, not a PassResult holding a Module",
                          location=f"pass {p.name}", hint="return PassResult(module, changed) from run()")
    return out


def parse_pipeline(spec: str | Sequence[str | Pass]) -> list[Pass]:
    """``"O2"``, ``"fold-batchnorm,fuse-elementwise"`` or a list of names / Pass objects."""
    items: list[str | Pass]
    if isinstance(spec, str):
        if spec.upper() in PIPELINES:
            items = list(PIPELINES[spec.upper()])
        else:
            items = [s.strip() for s in spec.split(",") if s.strip()]
            if not items:
                raise PipelineError(f"the pipeline {spec!r} names no pass", location="pipeline",
                                    hint="e.g. 'O2' or 'fold-batchnorm,dce' ('O0' runs nothing)")
    else:
        items = list(spec)
    out: list[Pass] = []
    for it in items:
        if isinstance(it, Pass):
            out.append(it)
            continue
        if it.upper() in PIPELINES:
            out.extend(parse_pipeline(it))
            continue
        cls = PASS_REGISTRY.get(it)
        if cls is None:
            raise PipelineError(f"unknown pass {it!r}", location="pipeline",
                                hint="known passes: " + ", ".join(sorted(PASS_REGISTRY)))
        out.append(cls())
    return out


def run_pipeline(module: Module, spec: str | Sequence[str | Pass], **kwargs: Any) -> PipelineResult:
    return PassManager(parse_pipeline(spec), **kwargs).run(module)
