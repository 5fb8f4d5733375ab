// Runs a library Cuvil compiled for wasm32-wasi (`cuvil compile --target wasm32-wasi`) in a browser
// or in Node: `const model = await CuvilWasm.load(bytes, spec); const outputs = model.run(inputs);`
//
// `spec` is what the library's manifest says (see cuvil/runtime/web_page.py): the entry symbols, and
// for each input and output its name, dtype, dtype code and static shape. Inputs are typed arrays
// (Float32Array for f32, BigInt64Array for i64, ...: `CuvilWasm.ARRAYS[dtype]`); outputs come back as
// fresh typed arrays. The module gets no WASI capabilities: any WASI call it makes answers ENOSYS.
(function (root) {
  "use strict";
  const ARRAYS = {
    f32: Float32Array, f64: Float64Array, i8: Int8Array, u8: Uint8Array, i16: Int16Array,
    u16: Uint16Array, i32: Int32Array, u32: Uint32Array, i64: BigInt64Array, u64: BigUint64Array,
    bool: Uint8Array,
  };
  const DESCRIPTOR = 16; // data, shape (32-bit pointers), rank, dtype
  const ENOSYS = 52;

  function numel(shape) { return shape.reduce((a, b) => a * b, 1); }

  async function load(bytes, spec) {
    const wasi = new Proxy({}, { get: () => () => ENOSYS });
    const { instance } = await WebAssembly.instantiate(bytes, { wasi_snapshot_preview1: wasi });
    const ex = instance.exports;
    if (ex._initialize) ex._initialize();
    const ctx = ex[spec.symbols.create]();
    if (!ctx) throw new Error("the model could not allocate its working memory");
    const tensors = [...spec.inputs, ...spec.outputs];
    for (const t of tensors) {
      if (!(t.dtype in ARRAYS)) throw new Error(`dtype ${t.dtype} is not supported by this loader`);
      if (!t.shape.every(Number.isInteger)) throw new Error(`${t.name} has symbolic dims: compile for static shapes`);
    }
    const bytesOf = (t) => numel(t.shape) * ARRAYS[t.dtype].BYTES_PER_ELEMENT;
    const align = (n) => Math.ceil(n / 64) * 64;
    const rankSum = tensors.reduce((a, t) => a + t.shape.length, 0);
    const head = align(DESCRIPTOR * tensors.length + 8 * rankSum + 1);
    const total = head + tensors.reduce((a, t) => a + align(Math.max(bytesOf(t), 1)), 0);
    const raw = ex.malloc(total + 64);
    if (!raw) throw new Error("the module's memory cannot hold the tensors");
    const base = align(raw);
    const dataAt = [];
    let at = base + head;
    for (const t of tensors) { dataAt.push(at); at += align(Math.max(bytesOf(t), 1)); }
    {
      const view = new DataView(ex.memory.buffer);
      let shapeAt = base + DESCRIPTOR * tensors.length;
      tensors.forEach((t, k) => {
        const d = base + DESCRIPTOR * k;
        view.setUint32(d, dataAt[k], true);
        view.setUint32(d + 4, shapeAt, true);
        view.setInt32(d + 8, t.shape.length, true);
        view.setInt32(d + 12, t.code, true);
        for (const n of t.shape) { view.setBigInt64(shapeAt, BigInt(n), true); shapeAt += 8; }
      });
    }
    const nIn = spec.inputs.length;
    return {
      run(inputs) {
        if (inputs.length !== nIn) throw new Error(`expected ${nIn} inputs, got ${inputs.length}`);
        inputs.forEach((a, k) => {
          const t = spec.inputs[k];
          if (!(a instanceof ARRAYS[t.dtype]) || a.length !== numel(t.shape)) {
            throw new Error(`input ${t.name}: expected ${numel(t.shape)} ${t.dtype} values`);
          }
          new Uint8Array(ex.memory.buffer, dataAt[k], a.byteLength)
            .set(new Uint8Array(a.buffer, a.byteOffset, a.byteLength));
        });
        const rc = ex[spec.symbols.run_checked](ctx, base, BigInt(nIn), base + DESCRIPTOR * nIn,
                                                  BigInt(spec.outputs.length));
        if (rc !== 0) throw new Error(`the model rejected its inputs (code ${rc})`);
        return spec.outputs.map((t, j) => {
          const k = nIn + j;
          const copy = new Uint8Array(bytesOf(t));
          copy.set(new Uint8Array(ex.memory.buffer, dataAt[k], bytesOf(t)));
          return new ARRAYS[t.dtype](copy.buffer);
        });
      },
      close() { ex[spec.symbols.destroy](ctx); ex.free(raw); },
    };
  }

  root.CuvilWasm = { load, ARRAYS };
})(typeof globalThis !== "undefined" ? globalThis : this);
