"""The C header that ships with a compiled library: entry points, codes, and the signature."""

from __future__ import annotations

from cuvil.codegen import abi
from cuvil.codegen.abi import TensorSpec
from cuvil.codegen.llvm_module import LoweredFunction

_C_TYPES = {
    "f32": "float", "f64": "double", "f16": "uint16_t /* IEEE half bits */",
    "bf16": "uint16_t /* bfloat16 bits */", "i8": "int8_t", "i16": "int16_t", "i32": "int32_t",
    "i64": "int64_t", "u8": "uint8_t", "u16": "uint16_t", "u32": "uint32_t", "u64": "uint64_t",
    "bool": "uint8_t /* 0 or 1 */",
    "f8e4m3fn": "uint8_t /* float8 e4m3fn bits */", "f8e4m3fnuz": "uint8_t /* float8 e4m3fnuz bits */",
    "f8e5m2": "uint8_t /* float8 e5m2 bits */", "f8e5m2fnuz": "uint8_t /* float8 e5m2fnuz bits */",
    "f8e8m0": "uint8_t /* float8 e8m0fnu bits */", "f4e2m1": "uint8_t /* float4 e2m1fn in the low nibble */",
    "i4": "uint8_t /* int4 two's complement in the low nibble */", "u4": "uint8_t /* uint4 in the low nibble */",
    "i2": "uint8_t /* int2 two's complement in the low 2 bits */", "u2": "uint8_t /* uint2 in the low 2 bits */",
}


def _spec_lines(kind: str, specs: tuple[TensorSpec, ...], macro: str) -> list[str]:
    lines = []
    for k, s in enumerate(specs):
        ident = abi.c_identifier(s.name).upper()
        dims = ", ".join(str(d) for d in s.shape)
        lines.append(f" *   {kind} {k}: {abi.c_comment(s.name)}: {s.dtype.value}[{abi.c_comment(dims)}]  "
                     f"({_C_TYPES[s.dtype.value]})")
        if all(isinstance(d, int) for d in s.shape):  # a shape class's sizes are known at run time only
            numel = 1
            for d in s.shape:
                numel *= int(d)
            lines.append(f"#define {macro}_{kind.upper()}_{k}_NUMEL {numel}  /* {ident} */")
    return lines


def _run_section(lf: LoweredFunction) -> str:
    """The declaration of the trusted run entry point: ``P_run``, or ``P_run_dims`` and the dims it takes."""
    p, macro, sc = lf.prefix, lf.prefix.upper(), lf.shape_class
    if sc is None:
        return f"""/* Run with data pointers in signature order; shapes and dtypes are trusted. */
int32_t {p}_run(void* ctx, void* const* inputs, void* const* outputs);"""
    rows, defines = [], [f"#define {macro}_NUM_DIMS {len(sc.symbols)}"]
    for j, s in enumerate(sc.symbols):
        lo, hi, mult = sc.bound(s)
        i, axis = sc.sources[j]
        rows.append(f" *   dims[{j}] = {abi.c_comment(s)}: {lo} <= {abi.c_comment(s)} <= {hi}"
                    + (f", a multiple of {mult}" if mult != 1 else "")
                    + f" (dim {axis} of input {i})")
        ident = abi.c_identifier(s).upper()
        defines += [f"#define {macro}_DIM_{j}_MIN {lo}  /* {ident} */",
                    f"#define {macro}_DIM_{j}_MAX {hi}  /* {ident} */"]
    return f"""/* This library serves a whole shape class: the symbolic dims of the signature take any values in
{chr(10).join(rows)}
 * {p}_run_checked solves them from the input shapes (CUVIL_ERR_SHAPE_CLASS when one is outside its
 * range) and checks every dim against its formula; the working memory is sized for the largest dims. */
{chr(10).join(defines)}

/* Run with the dims' values (int64, in the order above) and data pointers in signature order; dims,
 * shapes and dtypes are trusted. */
int32_t {p}_run_dims(void* ctx, const int64_t* dims, void* const* inputs, void* const* outputs);"""


def _guard_section(lf: LoweredFunction) -> str:
    """The declaration of ``P_guard_fault`` and what the guard checks (empty for an unguarded library)."""
    if lf.guard is None:
        return ""
    p, guard = lf.prefix, lf.guard
    lines = []
    for c in guard.plan(lf.inputs, lf.outputs):
        what = f"in [{c.lo!r}, {c.hi!r}]" if c.kind == "box" else "finite"
        lines.append(f" *   {c.side} {c.index} {abi.c_comment(c.spec.name)}: every element {what}")
    faults = ", ".join(f"{abi.ERROR_NAMES[code]} -> {abi.c_comment(name)}" for code in sorted(abi.GUARD_CODES)
                       if (name := guard.fault(code)) is not None) or "none named"
    return f"""
/* Fail-safe guard: {p}_run (and so {p}_run_checked) also checks the values, inputs before the ops run
 * and outputs after them:
{chr(10).join(lines) or " *   (no tensor holds numbers to check)"}
 * The first failing check decides the code: CUVIL_ERR_INPUT_BOX (an element outside its box),
 * CUVIL_ERR_INPUT_NONFINITE (a NaN or infinite input element) or CUVIL_ERR_OUTPUT_NONFINITE (the
 * outputs were written, but must not be used). */
#define {p.upper()}_GUARDED 1

/* The policy's fault a guard code stands for ({faults}), or NULL for any other code or where the policy
 * names no fault. The string is static: never free it. */
const char* {p}_guard_fault(int32_t code);
"""


def _profile_section(lf: LoweredFunction) -> str:
    """The declaration of ``P_profile`` (empty for a library compiled without per-step profiling)."""
    if not lf.profiled:
        return ""
    p = lf.prefix
    return f"""
/* Per-step profiling: {p}_run times each of its {len(lf.ops)} steps. Copies up to `capacity` step totals in
 * nanoseconds (run order; the manifest's profile.steps names them) into `ns` and returns the number of
 * runs counted; a non-zero `reset` zeroes the totals after reading them. */
#define {p.upper()}_NUM_STEPS {len(lf.ops)}
int64_t {p}_profile(int64_t* ns, int64_t capacity, int32_t reset);
"""


def render_header(lf: LoweredFunction, manifest_hash: str) -> str:
    p = lf.prefix
    macro = p.upper()
    guard = f"{macro}_H"
    sig = _spec_lines("input", lf.inputs, macro) + _spec_lines("output", lf.outputs, macro)
    comments = [s for s in sig if s.startswith(" *")]
    defines = [s for s in sig if s.startswith("#define")]
    codes = "\n".join(f"#define CUVIL_{abi.ERROR_NAMES[c]} {c}" for c in sorted(abi.ERROR_NAMES))
    dtypes = "\n".join(f"#define CUVIL_DTYPE_{d.value.upper()} {c}" for d, c in abi.DTYPE_CODES.items())
    name = abi.c_comment(lf.name)
    return f"""/* Generated by cuvil for function @{name}; model hash {lf.function_hash}; manifest {manifest_hash}.
 *
 * Signature (row-major, contiguous buffers):
{chr(10).join(comments)}
 *
 * Output buffers are allocated by the caller and must not overlap the inputs or each other.
 * A context owns the working memory; one context must not run on two threads at once.
 */
#ifndef {guard}
#define {guard}

#include <stdint.h>

#ifdef __cplusplus
extern "C" {{
#endif

#ifndef CUVIL_ABI_DEFINED
#define CUVIL_ABI_DEFINED
#define CUVIL_ABI_VERSION {abi.ABI_VERSION}
/* return codes */
{codes}
/* dtype codes (cuvil_tensor.dtype) */
{dtypes}
typedef struct cuvil_tensor {{
    void* data;            /* contiguous row-major elements */
    const int64_t* shape;  /* `rank` dims */
    int32_t rank;
    int32_t dtype;         /* a CUVIL_DTYPE_* code */
}} cuvil_tensor;
#endif

#define {macro}_NUM_INPUTS {len(lf.inputs)}
#define {macro}_NUM_OUTPUTS {len(lf.outputs)}
#define {macro}_ARENA_BYTES {lf.arena_bytes}
{chr(10).join(defines)}

/* A context (working memory for intermediates); NULL when allocation fails. */
void* {p}_create(void);
void {p}_destroy(void* ctx);

{_run_section(lf)}

/* Run after checking counts, dtypes, ranks, dims and null pointers; returns a CUVIL_ERR_* code
 * without touching any buffer when they do not match the signature. */
int32_t {p}_run_checked(void* ctx, const cuvil_tensor* inputs, int64_t n_inputs,
                        const cuvil_tensor* outputs, int64_t n_outputs);
{_guard_section(lf)}{_profile_section(lf)}
#ifdef __cplusplus
}}
#endif

#endif /* {guard} */
"""
