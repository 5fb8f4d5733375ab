"""What is checked before an adapter is loaded or merged, each finding with the module, tensor
and dimension at fault and what was expected against what was found.

Structure: every key is one PEFT reads; every adapter module exists in the base and is targeted
by the config; every targeted module has both factors; shapes agree with the base and the rank;
no empty tensors; float factors. Numbers: every value finite; the merged weight
``W + s·B·A`` (DoRA: rescaled per output row) rounded to the target dtype and refused where an
element overflows or loses more than the stated relative precision, decided exactly (a float32
screen with a sound error bound, float64 for what it cannot clear: :mod:`lora.merged`); a sound
bound on every merged element recorded beside it; the update's size relative to ``W``.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import ml_dtypes
import numpy as np

from lora.adapter import Adapter, ModuleTensors
from lora.base import BaseModel, BaseModule
from lora.identity import recorded, tensor_digest
from lora.merged import Block, FastScreen, MergedWeight, Screen, to_float64
from lora.screen_kernels import single_threaded_blas

TARGET_DTYPES: dict[str, np.dtype] = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16),
                                      "bf16": np.dtype(ml_dtypes.bfloat16)}
RELATIVE_PRECISION = {"fp32": 2.0 ** -23, "fp16": 2.0 ** -10, "bf16": 2.0 ** -7}
"""The relative error a merged element may have after rounding (twice the unit roundoff of a normal
number): elements past it are subnormal in the target type and reported."""
MAX_LISTED = 10
MAX_WORKERS = 8
BOUND_MARGIN = 1.0 + 2.0 ** -40  # covers the float64 rounding of the bound's own sums and products


@dataclass
class Finding:
    rule: str
    severity: str  # "error" | "warning"
    message: str
    module: str | None = None
    tensor: str | None = None
    expected: Any = None
    found: Any = None
    elements: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ModuleReport:
    """What was measured for one adapted module."""

    module: str
    kind: str
    rank: int
    scale: float
    update_norm_ratio: float | None = None  # ||s·B·A||_F / ||W||_F
    merged_max: float | None = None  # max |merged element|, exact
    bound_max: float | None = None  # max of the sound bound |W| + |s|·|B|·|A|
    dora: bool = False


@dataclass
class AdapterCheck:
    adapter: str
    base: str | None
    dtype: str
    findings: list[Finding] = field(default_factory=list)
    modules: list[ModuleReport] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def passed(self) -> bool:
        return not self.errors


def _workers(jobs: int) -> int:
    return max(1, min(jobs, MAX_WORKERS, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count() or 1))


def check_adapter(adapter: Adapter, base: BaseModel, *, dtype: str = "fp32", identity: str = "warn",
                  progress: Callable[[int, int, str], None] | None = None) -> AdapterCheck:
    """Every check on ``adapter`` against ``base``, merged weights judged in ``dtype``; ``progress(done,
    total, module)`` is called as each module's numbers are done."""
    if dtype not in TARGET_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(TARGET_DTYPES)}, got {dtype!r}")
    start = time.perf_counter()
    out = AdapterCheck(str(adapter.directory), base.name_or_path, dtype)
    out.findings += _identity(adapter, base, identity)
    for s in adapter.stray:
        out.findings.append(Finding("lora-key", "error", f"key {s.key!r} {s.reason}", tensor=s.key))
    out.findings += _coverage(adapter, base)
    out.findings += _copies(adapter, base)
    measured: list[tuple[ModuleTensors, BaseModule]] = []
    for entry in adapter.lora_modules:
        module = base.modules.get(entry.module)
        if module is None or not _targeted(adapter, module):
            continue
        found = _structure(adapter, entry, module)
        out.findings += found
        if not found:
            measured.append((entry, module))
    # modules are independent and numpy releases the GIL in its loops: a few threads (BLAS on one thread
    # each, not splitting every thin product over the cores those threads use), results in module order
    with single_threaded_blas(), ThreadPoolExecutor(max_workers=_workers(len(measured))) as pool:
        futures = [pool.submit(_numbers, adapter, entry, module, dtype) for entry, module in measured]
        for done, ((entry, _), future) in enumerate(zip(measured, futures, strict=True), 1):
            report, numeric = future.result()
            out.modules.append(report)
            out.findings += numeric
            if progress is not None:
                progress(done, len(measured), entry.module)
    out.seconds = time.perf_counter() - start
    return out


# --------------------------------------------------------------------------------------
# identity and coverage


def _identity(adapter: Adapter, base: BaseModel, policy: str) -> list[Finding]:
    severity = "error" if policy == "error" else "warning"
    return _named_identity(adapter, base, severity) + _content_identity(adapter, base, severity)


def _content_identity(adapter: Adapter, base: BaseModel, severity: str) -> list[Finding]:
    """Each base weight the adapter recorded a digest of (``cuvil lora stamp``) must have that digest."""
    out = []
    for module, digest in sorted(recorded(adapter).items()):
        found = base.modules.get(module)
        if found is None:
            continue  # reported by the coverage check
        actual = tensor_digest(found.weight)
        if actual != digest:
            out.append(Finding("lora-base-content", severity,
                               f"the base weight of {module!r} is not the one the adapter was stamped with "
                               f"(recorded {digest[:23]}..., found {actual[:23]}...): another base, or the same "
                               "base changed", module=module, tensor=f"{module}.weight", expected=digest,
                               found=actual))
    return out


def _named_identity(adapter: Adapter, base: BaseModel, severity: str) -> list[Finding]:
    claimed = adapter.config.base_model_name_or_path
    if not claimed or not base.name_or_path:
        return []
    if not _same_model(claimed, base.name_or_path):
        return [Finding("lora-base-identity", severity,
                        f"the adapter was trained on {claimed!r}, the base given is {base.name_or_path!r}",
                        expected=claimed, found=base.name_or_path)]
    if adapter.config.revision and adapter.config.revision != base.revision:
        return [Finding("lora-base-identity", severity,
                        f"the adapter names revision {adapter.config.revision!r} of its base; the base given "
                        f"{'is revision ' + repr(base.revision) if base.revision else 'records no revision'}",
                        expected=adapter.config.revision, found=base.revision)]
    return []


def _same_model(claimed: str, given: str) -> bool:
    """Hub ids must be equal; a local directory is known only by its name, compared with the id's last part."""
    claimed, given = claimed.rstrip("/"), given.rstrip("/")
    if _local(claimed) or _local(given):
        return PurePosixPath(claimed).name == PurePosixPath(given).name
    return claimed == given


def _local(name: str) -> bool:
    """A path on this machine rather than a hub id (``org/name``)."""
    return name.startswith(("/", ".", "~")) or name.count("/") != 1 or Path(name).exists()


def _targeted(adapter: Adapter, module: BaseModule) -> bool:
    return adapter.config.targets(module.name, is_linear=module.is_linear, is_output_layer=module.output_layer)


def _coverage(adapter: Adapter, base: BaseModel) -> list[Finding]:
    findings = []
    for entry in adapter.lora_modules:
        module = base.modules.get(entry.module)
        if module is None:
            findings.append(Finding("lora-module", "error", _unknown_module(entry.module, base), module=entry.module,
                                    tensor=entry.a or entry.b or entry.magnitude))
        elif not _targeted(adapter, module):
            findings.append(Finding("lora-module", "error",
                                    f"the adapter has tensors for {entry.module!r}, which its target_modules "
                                    f"({adapter.config.target_modules!r}) do not select: PEFT would drop them",
                                    module=entry.module))
    for module in base:
        if _targeted(adapter, module) and (module.name not in adapter.modules
                                           or adapter.modules[module.name] not in adapter.lora_modules):
            findings.append(Finding("lora-missing", "error",
                                    f"{module.name!r} ({module.kind}) is targeted by the config but the adapter has "
                                    "no lora_A/lora_B for it", module=module.name,
                                    expected="lora_A and lora_B", found="nothing"))
    return findings


def _copies(adapter: Adapter, base: BaseModel) -> list[Finding]:
    """A base weight the adapter carries a copy of (PEFT saves embeddings it resized) must be the base's."""
    findings = []
    for entry in adapter.modules.values():
        key = entry.copies.get("weight")
        module = base.modules.get(entry.module)
        if key is None or module is None or key not in adapter.file or entry.module in adapter.config.modules_to_save:
            continue
        info = adapter.info(key)
        if info.shape != module.weight.shape:
            findings.append(Finding("lora-base-identity", "error",
                                    f"the adapter's copy of {entry.module!r}.weight has shape {list(info.shape)}, the "
                                    f"base's is {list(module.weight.shape)} (a resized vocabulary?)",
                                    module=entry.module, tensor=key, expected=list(module.weight.shape),
                                    found=list(info.shape)))
        elif not _same_weight(adapter.array(key), np.asarray(module.weight)):
            findings.append(Finding("lora-base-identity", "error",
                                    f"the adapter's copy of {entry.module!r}.weight differs from the base's: the "
                                    "adapter was trained on another base model", module=entry.module, tensor=key))
    return findings


def _same_weight(copy: np.ndarray, weight: np.ndarray) -> bool:
    """The same values, or the copy rounds to exactly the base's (the base loaded in a narrower precision,
    as PEFT users load a float32-trained adapter onto a float16 or bfloat16 base)."""
    if np.array_equal(_as64(copy), _as64(weight)):
        return True
    narrower = copy.dtype != weight.dtype and copy.dtype.itemsize > weight.dtype.itemsize
    with np.errstate(over="ignore", invalid="ignore"):
        return narrower and np.array_equal(_as64(copy.astype(weight.dtype)), _as64(weight))


def _unknown_module(name: str, base: BaseModel) -> str:
    text = f"{name!r} is no adaptable module of the base model"
    close = [m for m in base.modules if m.endswith("." + name) or name.endswith("." + m)]
    if close:
        text += f" (did you mean {close[0]!r}? a prefix differs)"
    return text


# --------------------------------------------------------------------------------------
# structure


def _expected_shapes(adapter: Adapter, entry: ModuleTensors, module: BaseModule) -> dict[str, tuple[int, ...]]:
    r = adapter.config.rank(module.name)
    if module.kind == "embedding":
        return {"a": (r, module.in_features), "b": (module.out_features, r), "magnitude": (module.out_features,)}
    if module.kind == "conv":  # PEFT keeps a conv's magnitude shaped to broadcast: [1, out, 1, ...]
        w = module.weight.shape
        return {"a": (r, *w[1:]), "b": (w[0], r, *([1] * (len(w) - 2))), "magnitude": (1, w[0], *([1] * (len(w) - 2)))}
    return {"a": (r, module.in_features), "b": (module.out_features, r), "magnitude": (module.out_features,)}


def _structure(adapter: Adapter, entry: ModuleTensors, module: BaseModule) -> list[Finding]:
    findings = []
    want_embedding = module.kind == "embedding"
    if entry.embedding != want_embedding and (entry.a or entry.b):
        findings.append(Finding("lora-shape", "error",
                                f"{module.name!r} is a{'n embedding' if want_embedding else ' ' + module.kind} layer "
                                f"but the adapter stores {'embedding' if entry.embedding else 'linear'} factors",
                                module=module.name))
    for slot in ("a", "b"):
        if getattr(entry, slot) is None and (entry.a or entry.b):
            other = "B" if slot == "a" else "A"
            findings.append(Finding("lora-missing", "error",
                                    f"{module.name!r} has lora_{other} but no lora_{slot.upper()}",
                                    module=module.name, expected=f"lora_{slot.upper()}", found="nothing"))
    if entry.magnitude is not None and not adapter.config.use_dora:
        findings.append(Finding("lora-config", "error", f"{module.name!r} has a DoRA magnitude vector but the "
                                "config does not set use_dora", module=module.name, tensor=entry.magnitude))
    if adapter.config.use_dora and entry.magnitude is None and module.kind != "embedding" and (entry.a or entry.b):
        findings.append(Finding("lora-missing", "error", f"use_dora is set but {module.name!r} has no "
                                "lora_magnitude_vector", module=module.name))
    expected = _expected_shapes(adapter, entry, module)
    for slot in ("a", "b", "magnitude"):
        key = getattr(entry, slot)
        if key is None:
            continue
        info = adapter.info(key)
        if info.size == 0:
            findings.append(Finding("lora-shape", "error", f"{key!r} is empty (shape {list(info.shape)})",
                                    module=module.name, tensor=key, found=list(info.shape)))
            continue
        if info.dtype.kind not in "fV" and info.dtype != np.dtype(ml_dtypes.bfloat16):
            findings.append(Finding("lora-dtype", "error", f"{key!r} has dtype {info.dtype}, not a float type",
                                    module=module.name, tensor=key, expected="float", found=str(info.dtype)))
        want = expected.get(slot)
        if want is not None and info.shape != want:
            findings.append(Finding("lora-shape", "error", _shape_message(key, want, info.shape, adapter, module),
                                    module=module.name, tensor=key, expected=list(want), found=list(info.shape)))
    return findings


def _shape_message(key: str, want: tuple[int, ...], got: tuple[int, ...], adapter: Adapter,
                   module: BaseModule) -> str:
    dims = [k for k in range(max(len(want), len(got))) if k >= len(want) or k >= len(got) or want[k] != got[k]]
    text = f"{key!r} has shape {list(got)}, expected {list(want)}"
    if len(want) == len(got):
        text += "; " + ", ".join(f"dim {k}: expected {want[k]}, found {got[k]}" for k in dims)
    r = adapter.config.rank(module.name)
    text += f" (rank {r} from the config; the base weight of {module.name!r} is {list(module.weight.shape)})"
    return text


# --------------------------------------------------------------------------------------
# numbers


_as64 = to_float64


def _nonfinite(name: str, arr: np.ndarray, module: str) -> Finding | None:
    bad = ~np.isfinite(arr)
    n = int(bad.sum())
    if not n:
        return None
    where = [{"index": [int(i) for i in ix], "value": float(arr[tuple(ix)])} for ix in np.argwhere(bad)[:MAX_LISTED]]
    return Finding("lora-finite", "error", f"{name!r} has {n} non-finite values", module=module, tensor=name,
                   found=n, elements=where)


def _merged(adapter: Adapter, entry: ModuleTensors, module: BaseModule) -> MergedWeight:
    assert entry.a is not None and entry.b is not None
    magnitude = adapter.array(entry.magnitude) if entry.magnitude is not None else None
    return MergedWeight(module, adapter.array(entry.a), adapter.array(entry.b), adapter.config.scale(module.name),
                        magnitude)


def merged_weights(adapter: Adapter, base: BaseModel) -> dict[str, np.ndarray]:
    """The exact merged weight (float64, in the base weight's layout) of every module the adapter adapts."""
    out = {}
    for entry in adapter.lora_modules:
        module = base.modules.get(entry.module)
        if module is not None and entry.a is not None and entry.b is not None:
            out[entry.module] = _merged(adapter, entry, module).full()
    return out


@dataclass
class _Tally:
    """Elements of one module matching a condition, counted over blocks; the first few kept."""

    count: int = 0
    worst: float = 0.0
    listed: list[dict[str, Any]] = field(default_factory=list)

    def finding(self, rule: str, severity: str, tensor: str, expected: str, message: str) -> list[Finding]:
        """One finding for the elements counted (none when there are none)."""
        if not self.count:
            return []
        return [Finding(rule, severity, message, module=tensor.rsplit(".", 1)[0], tensor=tensor, expected=expected,
                        found=self.worst, elements=self.listed)]

    def add(self, merge: MergedWeight, block: Block, mask: np.ndarray, values: np.ndarray, score: np.ndarray) -> None:
        n = int(mask.sum())
        if not n:
            return
        self.count += n
        self.worst = max(self.worst, float(np.max(score[mask])))
        for r, c in np.argwhere(mask)[:MAX_LISTED - len(self.listed)]:
            self.listed.append({"index": list(merge.stored_index(block.rows.start + int(r), int(c))),
                                "value": float(values[r, c])})


def _numbers(adapter: Adapter, entry: ModuleTensors, module: BaseModule, dtype: str
             ) -> tuple[ModuleReport, list[Finding]]:
    assert entry.a is not None and entry.b is not None
    cfg = adapter.config
    report = ModuleReport(module.name, module.kind, cfg.rank(module.name), cfg.scale(module.name),
                          dora=entry.magnitude is not None)
    findings = [f for f in (_nonfinite(k, _as64(adapter.array(k)), module.name)
                            for k in (entry.a, entry.b, entry.magnitude) if k is not None) if f is not None]
    if findings:
        return report, findings
    info = ml_dtypes.finfo(TARGET_DTYPES[dtype])
    overflow_at = float(info.max) + 2.0 ** (info.maxexp - 1 - info.nmant) / 2  # rounds to inf from here on
    tiny, limit = float(info.smallest_normal), RELATIVE_PRECISION[dtype]
    merge = _merged(adapter, entry, module)
    screen = FastScreen(merge).run(overflow_at, tiny)
    if screen is not None:
        return report, findings + _screened(report, merge, screen, module, dtype, overflow_at, float(info.max))
    nonfinite, over, lossy = _Tally(), _Tally(), _Tally()
    w_sq = d_sq = merged_max = bound_max = 0.0
    for blk in merge.blocks():
        flat = blk.weight.ravel()
        block_sq = float(np.dot(flat, flat))
        if not math.isfinite(block_sq):  # an inf or NaN in the base weight (or squares past float64): look closer
            bad = ~np.isfinite(blk.weight)
            if bad.any():
                nonfinite.add(merge, blk, bad, blk.weight, np.zeros_like(blk.weight))
                continue
        w_sq += block_sq
        flat = blk.delta.ravel()
        d_sq += float(np.dot(flat, flat))
        mag = np.abs(blk.merged)
        block_max = float(np.max(mag, initial=0.0))
        merged_max = max(merged_max, block_max)
        bound_max = max(bound_max, float(np.max(blk.bound, initial=0.0)))
        if block_max >= overflow_at:
            over.add(merge, blk, mag >= overflow_at, blk.merged, mag)
        if float(np.min(mag, initial=math.inf)) < tiny:
            small = (mag < tiny) & (mag > 0)
            if small.any():
                rel = np.zeros_like(mag)
                vals = blk.merged[small]
                rel[small] = np.abs(vals.astype(TARGET_DTYPES[dtype]).astype(np.float64) - vals) / np.abs(vals)
                lossy.add(merge, blk, rel > limit, blk.merged, rel)
    if nonfinite.count:
        name = f"{module.name}.weight (base)"
        return report, [Finding("lora-finite", "error", f"{name!r} has {nonfinite.count} non-finite values",
                                module=module.name, tensor=name, found=nonfinite.count, elements=nonfinite.listed)]
    report.update_norm_ratio = float(np.sqrt(d_sq / w_sq)) if w_sq > 0 else math.inf
    report.merged_max, report.bound_max = merged_max, bound_max * BOUND_MARGIN
    target = f"{module.name}.weight"
    max_text = f"{float(info.max):.6g}"
    findings += over.finding("lora-merge-overflow", "error", target, f"|merged| <= {float(info.max)}",
                             f"merging into {module.name!r} in {dtype} overflows {over.count} elements (largest "
                             f"|merged| {over.worst:.6g}, {dtype} max {max_text})")
    findings += lossy.finding("lora-merge-precision", "warning", target, f"relative error <= {limit:.3g}",
                              f"merging into {module.name!r} in {dtype} loses more than {limit:.3g} relative "
                              f"precision on {lossy.count} elements (they are subnormal in {dtype})")
    return report, findings


def _screened(report: ModuleReport, merge: MergedWeight, screen: Screen, module: BaseModule, dtype: str,
              overflow_at: float, max_finite: float) -> list[Finding]:
    """Findings from the float32 screen: exact float64 values only for the rows and elements it could not clear."""
    fast = FastScreen(merge)
    report.update_norm_ratio = math.sqrt(screen.update_sq / screen.weight_sq) if screen.weight_sq > 0 else math.inf
    report.merged_max, report.bound_max = fast.exact_max(screen), screen.bound
    target, limit = f"{module.name}.weight", RELATIVE_PRECISION[dtype]
    over, lossy = _Tally(), _Tally()
    if screen.big_rows:
        rows = np.repeat(np.asarray(screen.big_rows), merge.cols)
        cols = np.tile(np.arange(merge.cols), len(screen.big_rows))
        values = fast.exact(rows, cols)
        _tally_elements(over, merge, rows, cols, values, np.abs(values) >= overflow_at, np.abs(values))
    if screen.small_rows:
        rows, cols = np.concatenate(screen.small_rows), np.concatenate(screen.small_cols)
        values = fast.exact(rows, cols)
        mag = np.abs(values)
        small = (mag > 0) & (mag < float(ml_dtypes.finfo(TARGET_DTYPES[dtype]).smallest_normal))
        rel = np.zeros_like(mag)
        rel[small] = np.abs(values[small].astype(TARGET_DTYPES[dtype]).astype(np.float64) - values[small]) / mag[small]
        _tally_elements(lossy, merge, rows, cols, values, rel > limit, rel)
    return (over.finding("lora-merge-overflow", "error", target, f"|merged| <= {max_finite}",
                         f"merging into {module.name!r} in {dtype} overflows {over.count} elements (largest "
                         f"|merged| {over.worst:.6g}, {dtype} max {max_finite:.6g})")
            + lossy.finding("lora-merge-precision", "warning", target, f"relative error <= {limit:.3g}",
                            f"merging into {module.name!r} in {dtype} loses more than {limit:.3g} relative "
                            f"precision on {lossy.count} elements (they are subnormal in {dtype})"))


def _tally_elements(tally: _Tally, merge: MergedWeight, rows: np.ndarray, cols: np.ndarray, values: np.ndarray,
                    mask: np.ndarray, score: np.ndarray) -> None:
    n = int(mask.sum())
    if not n:
        return
    tally.count += n
    tally.worst = max(tally.worst, float(np.max(score[mask])))
    for k in np.flatnonzero(mask)[:MAX_LISTED - len(tally.listed)]:
        tally.listed.append({"index": list(merge.stored_index(int(rows[k]), int(cols[k]))), "value": float(values[k])})


def summarize(check: AdapterCheck) -> Iterable[str]:
    """Lines for a terminal: one per finding, then one per module measured."""
    for f in check.findings:
        yield f"{f.severity.upper():7} {f.rule:22} {f.message}"
    for m in check.modules:
        ratio = "n/a" if m.update_norm_ratio is None else f"{m.update_norm_ratio:.3g}"
        yield (f"module  {m.module}: {m.kind}, rank {m.rank}, scale {m.scale:.6g}{', DoRA' if m.dora else ''}, "
               f"|update|/|W| {ratio}, max |merged| {m.merged_max:.6g} (bound {m.bound_max:.6g})")
