"""``compile``: a model in, a native callable out.

Native code is compiled for static shapes. A function with symbolic dims is *specialized*:
the dims are solved from input shapes, checked against the function's constraints and
substituted into every type and attribute, and every op's shape rule is re-run at those
shapes. By default (no ``output_dir``) the returned model specializes on first sight of
each shape signature and keeps every specialization, in memory and in the artifact cache;
with ``output_dir`` (one artifact on disk) the dims come from ``example_inputs`` or
``input_shapes``.

Compiles are cached (see :mod:`cuvil.runtime.cache`) under a key made of the model's
structural hash, the options, the specialized dims, the toolchain and the CPU. For a model
given as a file, a digest of the file maps to the model hash, so a cache hit skips even the
import.

By job: :mod:`cuvil.compiler.targets` says what a target name means, :mod:`cuvil.compiler.keys`
what identifies a build in the cache, :mod:`cuvil.compiler.job` carries one request through
import, specialization, optimization and code generation (or finds it in the cache).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cuvil.compiler.job import CompileJob
from cuvil.compiler.keys import pipeline_key, prober_digest, toolchain_fingerprint
from cuvil.compiler.targets import resolve_target
from cuvil.errors import CodegenError, InputError
from cuvil.ir.specialize import Shapes, requested_shapes
from cuvil.runtime.cache import ArtifactCache
from cuvil.runtime.loader import CompiledModel

BACKENDS = ("llvm",)


def compile(model: Any, *, backend: str = "llvm", target: str | None = None, opt_level: int = 3,
            threads: int | None = None, example_inputs: Any = None, input_shapes: Shapes | None = None,
            passes: str | Sequence[Any] | None = None, gate: Any = None, function: str | None = None,
            output_dir: str | Path | None = None, name: str | None = None, keep_ir: bool = False,
            cache: bool = True, dynamic: bool | None = None, fp16: bool = False,
            ranges: Mapping[str, tuple[float, float]] | None = None, fp16_strict: bool | None = None,
            lora: Any = None, merge: bool = True, lora_base: Any = None, failsafe: Any = None,
            shape_class: bool = False, dim_max: Mapping[str, int] | None = None, int8: bool | None = None,
            bf16: bool = False, profile: bool = False, **import_options: Any) -> CompiledModel:
    """Compile ``model`` (anything :func:`cuvil.import_model` accepts) to a shared library and load it.

    The optimization pipeline is ``O<opt_level>`` unless ``passes`` names one (``"O2"``,
    ``"fold-batchnorm,fuse-elementwise"`` or a list of Pass objects); ``gate`` is the pass
    manager's gate hook (the verifier's). ``example_inputs`` doubles as the torch export inputs
    and as the source of concrete dims. ``target`` is the host (``None``, ``"host"``,
    ``"x86-64"``, ``"x86_64-linux-gnu"``); other targets are refused for now.

    ``cache=True`` loads and stores the artifact in the user's cache; ``output_dir`` (or
    ``cache=False``) bypasses it: the library, header and manifest go to ``output_dir`` (default
    a fresh temporary folder). ``dynamic`` (default: true unless ``output_dir`` is given) makes a
    function with symbolic dims specialize per shape signature at call time.

    ``fp16=True`` runs in float16 every float32 op whose float16 sites the overflow prober proves
    finite for inputs in ``ranges`` (``{"x": (-1.0, 1.0)}``, one ``(lo, hi)`` per input, integer
    inputs such as token ids included); every other op stays float32, and the manifest's
    ``precision`` entry lists them with the reason. ``fp16_strict=True`` (default: whether
    ``gate`` is a strict gate) refuses instead (``CUVIL-FP16-UNPROVED``, nothing emitted) when any
    op float16 applies to is not proved.

    ``lora`` adds PEFT adapters (a directory, ``(directory, weight)``, or a list of them), each checked
    first: ``merge=True`` merges them into the weights by ``merge-low-rank`` and ``fold-constants``,
    proved under ``gate`` like every pass; ``merge=False`` keeps each update as two small matrix
    products beside its weight. ``lora_base`` names the modules when ``model`` is not the ``torch``
    module the adapters were trained on (a Hugging Face directory or :class:`lora.BaseModel`).

    ``int8`` (default: ``opt_level == 3`` unless ``fp16``, whose plan then covers the imported ops) runs
    a QDQ model's quantized matmuls and convs in int8 x int8 -> int32 arithmetic (QLinear semantics,
    ``quantize-int8``) when the overflow prober proves that no int32 accumulator can wrap; the
    manifest's ``int8`` entry records the decision. It is a declared precision change (a requantized
    value may differ from the float QDQ graph's by one quantization step), applied before the proved
    pipeline like FP16. ``int8=False`` compiles the float QDQ graph.

    ``bf16=True`` computes every float32 matmul (K even) and ungrouped conv by constant weights as a
    ``bf16_matmul`` / ``bf16_conv``: both operands rounded to bfloat16, the products summed in float32
    (``vdpbf16ps`` where the CPU has AVX512-BF16, twice the products per instruction of float32), batch norms
    after them folded into the weights first; every other op stays float32. It is a declared precision
    change (contract ``bounded``: about three significant digits per operand) applied before the proved
    pipeline (:mod:`cuvil.compiler.bf16_plan`); the manifest's ``precision`` entry counts the products and
    lists those kept float32 with the reason. It excludes ``fp16``.

    ``profile=True`` builds a library that times every op of each run (the monotonic clock read around
    each, about 20 ns a read; Linux targets): :meth:`CompiledModel.profile` reads the times, and
    ``cuvil run --profile`` prints them. The computation is the same as without it.

    ``failsafe`` (a fail-safe policy: its JSON file or the parsed document) builds the policy's guard
    into the library: every input element finite and inside the policy's box for it, every output
    element finite, checked in native code; a violation raises :class:`cuvil.runtime.GuardFault`
    with the policy's fault and the mode it calls for (``run_guarded`` returns it instead).
    """
    fp16_request = _fp16_request(fp16, ranges, fp16_strict, gate)
    if bf16 and fp16:
        raise InputError("bf16 and fp16 are two precisions for the same ops: choose one", location="bf16",
                         hint="drop fp16=True (--enable-fp16) or bf16=True (--precision bf16)")
    guard = _failsafe_guard(failsafe)
    if lora is not None:
        from cuvil.passes.manager import parse_pipeline
        from lora.compiled import with_adapters

        model, first = with_adapters(model, lora, merge=merge, example_inputs=example_inputs, base=lora_base,
                                     dtype="fp16" if fp16 else "fp32", **import_options)
        passes = [*first, *parse_pipeline(passes if passes is not None else f"O{opt_level}")]
        import_options = {}
    if backend not in BACKENDS:
        raise CodegenError(f"unknown backend {backend!r}", hint="backends: " + ", ".join(BACKENDS))
    if not isinstance(opt_level, int) or not 0 <= opt_level <= 3:
        raise CodegenError(f"opt_level must be 0..3, got {opt_level!r}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise CodegenError(f"threads must be a positive integer, got {threads!r}")
    host = resolve_target(target)
    store = ArtifactCache() if cache and output_dir is None else None
    job = CompileJob(model, example_inputs=example_inputs, import_options=import_options, function=function,
                     passes=passes if passes is not None else f"O{opt_level}", gate=gate, opt_level=opt_level,
                      name=name, keep_ir=keep_ir, threads=threads, target=host, store=store,
                      output_dir=Path(output_dir) if output_dir is not None else None, fp16=fp16_request,
                      guard=guard, dim_max=dim_max if shape_class else None,
                      int8=opt_level == 3 and not fp16 if int8 is None else bool(int8), bf16=bool(bf16),
                      profile=bool(profile))
    sig = job.signature()
    if guard is not None:
        guard.check_model(sig.inputs)
    if dim_max is not None and not shape_class:
        raise InputError("dim_max sizes a library compiled for a whole shape class", location="dim_max",
                         hint="pass shape_class=True with it (on the command line, --dim-max without --shape)")
    if shape_class and not sig.is_static:
        if fp16_request is not None:
            raise InputError("FP16 is planned per specialization (the prober needs static shapes)",
                             location=sig.function, hint="give concrete shapes (input_shapes=...) with fp16=True")
        lib = job.library({})
        job.release()
        return CompiledModel.from_library(lib, ir=job.optimized)
    if sig.is_static:
        lib = job.library({})
        job.release()
        return CompiledModel.from_library(lib, ir=job.optimized)
    shapes = requested_shapes(sig.function, [(s.name, s.shape) for s in sig.inputs], example_inputs, input_shapes)
    if dynamic is None:
        dynamic = output_dir is None
    if not dynamic:
        if shapes is None:
            symbolic = ", ".join(str(s) for s in sig.inputs if not all(isinstance(d, int) for d in s.shape))
            raise CodegenError(f"@{sig.function} has symbolic dims ({symbolic}); one artifact is compiled for "
                               "static shapes", location=sig.function,
                               hint="pass example_inputs=... or input_shapes=... to compile() (on the command "
                                    "line: --shape INPUT=2x3x...), or compile without output_dir to specialize "
                                    "per shape at run time")
        lib = job.library(sig.bind(shapes))
        job.release()
        return CompiledModel.from_library(lib, ir=job.optimized)
    job.per_shape_folders = True
    compiled = CompiledModel.specializing(sig, job.library, ir=job.optimized)
    if shapes is not None:
        compiled.specialize(sig.bind(shapes))
    return compiled


def _failsafe_guard(policy: Any) -> Any:
    """The guard a fail-safe policy asks the library to carry (None without a policy). The policy reader
    is imported only when one is given: most compiles have none."""
    if policy is None:
        return None
    from failsafe.guard import read_policy

    return read_policy(policy)


def _fp16_request(fp16: bool, ranges: Mapping[str, Any] | None, strict: bool | None, gate: Any
                  ) -> dict[str, Any] | None:
    """What an FP16 compile asks for (part of the cache key): the declared ranges and whether an
    unproved op refuses the build. The ranges are checked against the inputs when the plan is made."""
    if not fp16:
        if ranges:
            raise InputError("input ranges only apply to an FP16 compile", location="ranges",
                             hint="pass fp16=True (on the command line: --enable-fp16) or drop the ranges")
        return None
    if not ranges:
        raise InputError("an FP16 compile needs the declared range of every input: only ops proved safe for "
                         "those ranges run in float16", location="ranges",
                         hint="pass ranges={'x': (-1.0, 1.0)} (on the command line: --range x=-1:1, repeatable, "
                              "or --calibrate DIR of .npy samples)")
    box: dict[str, list[float]] = {}
    for k, r in sorted(ranges.items(), key=lambda kv: str(kv[0])):
        try:
            lo, hi = (float(x) for x in r)
        except (TypeError, ValueError):
            raise InputError(f"the range of {k!r} must be a pair (lo, hi) of numbers, got {r!r}",
                             location="ranges") from None
        box[str(k)] = [lo, hi]
    return {"ranges": box, "strict": bool(strict) if strict is not None else getattr(gate, "policy", None) == "strict",
            "prober": prober_digest()}


__all__ = ["BACKENDS", "compile", "pipeline_key", "resolve_target", "toolchain_fingerprint"]
