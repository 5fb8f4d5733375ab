"""A plain C program uses a compiled model through the generated header and dlopen:
no Python in the loop. Its outputs are compared with the interpreter. Each test runs for the
host and for aarch64 (cross-compiled program and library, run under qemu-aarch64)."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.compiler import compile
from cuvil.interp import run_reference
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from tests.cross_targets import C_TARGETS, c_toolchain, run_c_program

PROGRAM = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuvil_tiny.h"

#define LOAD(h, name) ((__typeof__(&name))dlsym(h, #name))

static void* read_file(const char* path, size_t bytes) {
    FILE* f = fopen(path, "rb");
    if (!f) return NULL;
    void* p = malloc(bytes ? bytes : 1);
    size_t got = fread(p, 1, bytes, f);
    fclose(f);
    return got == bytes ? p : NULL;
}

int main(int argc, char** argv) {
    if (argc != 5) return 90;
    void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 91; }
    __typeof__(&cuvil_tiny_create) create = LOAD(h, cuvil_tiny_create);
    __typeof__(&cuvil_tiny_destroy) destroy = LOAD(h, cuvil_tiny_destroy);
    __typeof__(&cuvil_tiny_run) run = LOAD(h, cuvil_tiny_run);
    __typeof__(&cuvil_tiny_run_checked) run_checked = LOAD(h, cuvil_tiny_run_checked);
    if (!create || !destroy || !run || !run_checked) return 92;

    float* x = read_file(argv[2], CUVIL_TINY_INPUT_0_NUMEL * sizeof(float));
    int64_t* ids = read_file(argv[3], CUVIL_TINY_INPUT_1_NUMEL * sizeof(int64_t));
    if (!x || !ids) return 93;
    float* y = calloc(CUVIL_TINY_OUTPUT_0_NUMEL, sizeof(float));
    float* y2 = calloc(CUVIL_TINY_OUTPUT_0_NUMEL, sizeof(float));
    int64_t xs[2] = {4, 6}, is[1] = {3}, ys[2] = {3, 5};
    cuvil_tensor in[2] = {{x, xs, 2, CUVIL_DTYPE_F32}, {ids, is, 1, CUVIL_DTYPE_I64}};
    cuvil_tensor out[1] = {{y, ys, 2, CUVIL_DTYPE_F32}};

    void* ctx = create();
    if (!ctx) return 94;
    int rc = run_checked(ctx, in, CUVIL_TINY_NUM_INPUTS, out, CUVIL_TINY_NUM_OUTPUTS);

    int64_t bad_shape[2] = {4, 7};
    cuvil_tensor bad[2] = {{x, bad_shape, 2, CUVIL_DTYPE_F32}, {ids, is, 1, CUVIL_DTYPE_I64}};
    int rc_shape = run_checked(ctx, bad, 2, out, 1);
    cuvil_tensor wrong_dtype[2] = {{x, xs, 2, CUVIL_DTYPE_F64}, {ids, is, 1, CUVIL_DTYPE_I64}};
    int rc_dtype = run_checked(ctx, wrong_dtype, 2, out, 1);
    int rc_arity = run_checked(ctx, in, 1, out, 1);

    void* ins[2] = {x, ids};
    void* outs[1] = {y2};
    int rc_plain = run(ctx, ins, outs);
    int same = memcmp(y, y2, CUVIL_TINY_OUTPUT_0_NUMEL * sizeof(float)) == 0;

    FILE* f = fopen(argv[4], "wb");
    if (!f) return 95;
    fwrite(y, sizeof(float), CUVIL_TINY_OUTPUT_0_NUMEL, f);
    fclose(f);
    printf("%d %d %d %d %d %d\n", rc, rc_shape, rc_dtype, rc_arity, rc_plain, same);
    destroy(ctx);
    dlclose(h);
    return 0;
}
"""


@pytest.mark.parametrize("target", C_TARGETS)
def test_c_program_runs_the_library_through_the_header(tmp_path, target):
    cc, run_prefix = c_toolchain(target)
    if cc is None:
        pytest.skip("no C compiler")
    rng = np.random.default_rng(3)
    b = Builder()
    x = b.param("x", DType.f32, [4, 6])
    ids = b.param("ids", DType.i64, [3])
    w = b.const(rng.standard_normal((6, 5)).astype(np.float32))
    y = b.tanh(b.matmul(b.gather(x, ids, axis=0), w))
    m = b.module(b.function("tiny", [x, ids], [y], ["y"]))
    model = compile(m, output_dir=tmp_path / "lib", target=target)

    xv = rng.standard_normal((4, 6)).astype(np.float32)
    iv = np.array([3, 0, -2], np.int64)
    (tmp_path / "x.bin").write_bytes(xv.tobytes())
    (tmp_path / "ids.bin").write_bytes(iv.tobytes())
    exe = tmp_path / "consumer"
    out = run_c_program(cc, run_prefix, PROGRAM, tmp_path / "lib", exe, model.library_path, tmp_path / "x.bin",
                        tmp_path / "ids.bin", tmp_path / "y.bin")
    rc, rc_shape, rc_dtype, rc_arity, rc_plain, same = map(int, out.split())
    header = (tmp_path / "lib" / "cuvil_tiny.h").read_text()
    codes = {line.split()[1]: int(line.split()[2]) for line in header.splitlines()
             if line.startswith("#define CUVIL_ERR_") or line.startswith("#define CUVIL_OK")}
    assert (rc, rc_plain, same) == (codes["CUVIL_OK"], codes["CUVIL_OK"], 1)
    assert rc_shape == codes["CUVIL_ERR_SHAPE"]
    assert rc_dtype == codes["CUVIL_ERR_DTYPE"]
    assert rc_arity == codes["CUVIL_ERR_ARITY"]
    got = np.frombuffer((tmp_path / "y.bin").read_bytes(), np.float32).reshape(3, 5)
    want = run_reference(m, [xv, iv])[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


CLASS_PROGRAM = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include "cuvil_seq.h"

/* x[N, 6] -> y[N, 5]: run at every N given on the command line, through run_checked and run_dims */
int main(int argc, char** argv) {
    void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) return 91;
    __typeof__(&cuvil_seq_create) create = (__typeof__(&cuvil_seq_create))dlsym(h, "cuvil_seq_create");
    __typeof__(&cuvil_seq_destroy) destroy = (__typeof__(&cuvil_seq_destroy))dlsym(h, "cuvil_seq_destroy");
    __typeof__(&cuvil_seq_run_dims) run_dims = (__typeof__(&cuvil_seq_run_dims))dlsym(h, "cuvil_seq_run_dims");
    __typeof__(&cuvil_seq_run_checked) run_checked =
        (__typeof__(&cuvil_seq_run_checked))dlsym(h, "cuvil_seq_run_checked");
    if (!create || !destroy || !run_dims || !run_checked || CUVIL_SEQ_NUM_DIMS != 1) return 92;
    void* ctx = create();
    if (!ctx) return 94;
    for (int a = 2; a < argc; a++) {
        int64_t n = atoll(argv[a]);
        float* x = malloc(sizeof(float) * (n * 6 + 1));
        float* y = malloc(sizeof(float) * (n * 5 + 1));
        float* y2 = malloc(sizeof(float) * (n * 5 + 1));
        for (int64_t i = 0; i < n * 6; i++) x[i] = (float)((i * 37) % 11) / 7.0f - 0.5f;
        int64_t xs[2] = {n, 6}, ys[2] = {n, 5};
        cuvil_tensor in[1] = {{x, xs, 2, CUVIL_DTYPE_F32}};
        cuvil_tensor out[1] = {{y, ys, 2, CUVIL_DTYPE_F32}};
        int rc = run_checked(ctx, in, 1, out, 1);
        int64_t dims[1] = {n};
        void* ins[1] = {x};
        void* outs[1] = {y2};
        int rc_dims = n >= CUVIL_SEQ_DIM_0_MIN && n <= CUVIL_SEQ_DIM_0_MAX ? run_dims(ctx, dims, ins, outs) : -1;
        double sum = 0;
        int same = 1;
        for (int64_t i = 0; rc == 0 && i < n * 5; i++) { sum += y[i]; same &= y[i] == y2[i]; }
        printf("%lld %d %d %d %.9g\n", (long long)n, rc, rc_dims, same, sum);
        free(x); free(y); free(y2);
    }
    destroy(ctx);
    dlclose(h);
    return 0;
}
"""


@pytest.mark.parametrize("target", C_TARGETS)
def test_c_program_runs_one_library_at_every_size_of_its_shape_class(tmp_path, target):
    cc, run_prefix = c_toolchain(target)
    if cc is None:
        pytest.skip("no C compiler")
    rng = np.random.default_rng(4)
    b = Builder()
    x = b.param("x", DType.f32, ["N", 6])
    w = b.const(rng.standard_normal((6, 5)).astype(np.float32))
    y = b.tanh(b.matmul(x, w))
    m = b.module(b.function("seq", [x], [y], ["y"]))
    compile(m, output_dir=tmp_path / "lib", shape_class=True, dim_max={"N": 40}, target=target)
    exe = tmp_path / "consumer"
    sizes = [1, 7, 40, 41, 0]
    out = run_c_program(cc, run_prefix, CLASS_PROGRAM, tmp_path / "lib", exe, tmp_path / "lib" / "libcuvil_seq.so",
                        *sizes)
    rows = [line.split() for line in out.splitlines()]
    assert [int(r[0]) for r in rows] == sizes
    for n, rc, rc_dims, same, total in rows:
        n = int(n)
        if n in (0, 41):  # below its constraint (N >= 1) and above the library's largest N
            assert (int(rc), int(rc_dims)) == (10, -1)  # CUVIL_ERR_SHAPE_CLASS, and run_dims is not tried
            continue
        assert (int(rc), int(rc_dims), int(same)) == (0, 0, 1)
        xv = ((np.arange(n * 6) * 37 % 11) / 7.0 - 0.5).astype(np.float32).reshape(n, 6)
        want = run_reference(m, [xv])[0]
        assert float(total) == pytest.approx(float(want.astype(np.float64).sum()), rel=1e-5, abs=1e-5)
