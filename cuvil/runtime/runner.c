/* Runs one call of a Cuvil library built for another architecture (under qemu-user, or on that
 * machine): `cuvil-runner LIB.so REQUEST RESPONSE`.
 *
 * REQUEST  "CUVLREQ1", u32 prefix length, prefix, u32 inputs, u32 outputs, then per tensor (inputs,
 *          then outputs): i32 dtype code, i32 rank, i64 dims[rank], u64 bytes, and for inputs the bytes.
 * RESPONSE "CUVLRES1", i32 the library's return code, then per output: u64 bytes and the bytes.
 *
 * Exit status: 0 the call ran (whatever its code), 3 a malformed request, 4 the library or an entry
 * point could not be loaded, 5 out of memory. Everything is little-endian, as on both hosts. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    void* data;
    int64_t* shape;
    int32_t rank;
    int32_t dtype;
} cuvil_tensor;

typedef void* (*create_fn)(void);
typedef void (*destroy_fn)(void*);
typedef int32_t (*run_fn)(void*, const cuvil_tensor*, int64_t, cuvil_tensor*, int64_t);

#define MAX_TENSORS 4096
#define MAX_RANK 64

static FILE* req;

static int take(void* dst, size_t n) { return fread(dst, 1, n, req) == n; }

static void* lookup(void* lib, const char* prefix, const char* entry) {
    char name[512];
    if (snprintf(name, sizeof name, "%s_%s", prefix, entry) >= (int)sizeof name) return NULL;
    return dlsym(lib, name);
}

static int read_tensor(cuvil_tensor* t, uint64_t* bytes, int with_data) {
    if (!take(&t->dtype, 4) || !take(&t->rank, 4) || t->rank < 0 || t->rank > MAX_RANK) return 3;
    t->shape = calloc((size_t)t->rank + 1, sizeof(int64_t));
    if (!t->shape) return 5;
    if (t->rank && !take(t->shape, (size_t)t->rank * 8)) return 3;
    if (!take(bytes, 8)) return 3;
    t->data = malloc(*bytes ? *bytes : 1);
    if (!t->data) return 5;
    if (with_data && *bytes && !take(t->data, *bytes)) return 3;
    return 0;
}

int main(int argc, char** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s LIB.so REQUEST RESPONSE\n", argv[0]);
        return 3;
    }
    req = fopen(argv[2], "rb");
    if (!req) { perror(argv[2]); return 3; }
    char magic[8];
    uint32_t plen, n_in, n_out;
    if (!take(magic, 8) || memcmp(magic, "CUVLREQ1", 8) || !take(&plen, 4) || plen == 0 || plen > 400) return 3;
    char prefix[401];
    if (!take(prefix, plen)) return 3;
    prefix[plen] = 0;
    if (!take(&n_in, 4) || !take(&n_out, 4) || n_in > MAX_TENSORS || n_out > MAX_TENSORS) return 3;
    cuvil_tensor* ins = calloc(n_in + 1, sizeof(cuvil_tensor));
    cuvil_tensor* outs = calloc(n_out + 1, sizeof(cuvil_tensor));
    uint64_t* out_bytes = calloc(n_out + 1, sizeof(uint64_t));
    if (!ins || !outs || !out_bytes) return 5;
    for (uint32_t k = 0; k < n_in; k++) {
        uint64_t bytes;
        int rc = read_tensor(&ins[k], &bytes, 1);
        if (rc) return rc;
    }
    for (uint32_t k = 0; k < n_out; k++) {
        int rc = read_tensor(&outs[k], &out_bytes[k], 0);
        if (rc) return rc;
    }
    fclose(req);

    void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 4; }
    create_fn create = (create_fn)lookup(lib, prefix, "create");
    destroy_fn destroy = (destroy_fn)lookup(lib, prefix, "destroy");
    run_fn run = (run_fn)lookup(lib, prefix, "run_checked");
    if (!create || !destroy || !run) { fprintf(stderr, "missing entry points for %s\n", prefix); return 4; }
    void* ctx = create();
    if (!ctx) return 5;
    int32_t code = run(ctx, ins, n_in, outs, n_out);
    destroy(ctx);

    FILE* res = fopen(argv[3], "wb");
    if (!res) { perror(argv[3]); return 3; }
    fwrite("CUVLRES1", 1, 8, res);
    fwrite(&code, 4, 1, res);
    for (uint32_t k = 0; k < n_out; k++) {
        uint64_t bytes = code == 0 ? out_bytes[k] : 0;
        fwrite(&bytes, 8, 1, res);
        if (bytes) fwrite(outs[k].data, 1, bytes, res);
    }
    return fclose(res) == 0 ? 0 : 3;
}
