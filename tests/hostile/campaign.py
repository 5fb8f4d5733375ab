"""A generated campaign of hostile inputs for the ``cuvil`` command: malformed models, hostile
names, huge shapes, corrupt artifacts and manifests, and command-line misuse. Each case builds
its files in its own folder and names the command line to run there."""

from __future__ import annotations

import atexit
import json
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

EXAMPLE = Path(__file__).resolve().parents[2] / "bench" / "examples" / "tiny_cnn.onnx"
ANY = ("ok", "check failed", "coded error", "undecided")


@dataclass
class Case:
    name: str
    setup: Callable[[Path], list[str]]
    """Writes the case's files into the folder and returns the command line (without ``cuvil``)."""
    expect: tuple[str, ...] = ANY
    close_stdout: bool = False
    limit: float = 60.0
    check: Callable[[Path, object], None] | None = None
    tags: tuple[str, ...] = field(default_factory=tuple)


# --------------------------------------------------------------------------------------
# models


def _vi(name: str, dims: list, dtype: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, dims)


def mlp(inp: str = "x", out: str = "y", dims: list | None = None, w_name: str = "w") -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), w_name)
    b = numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", [inp, w_name], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
             helper.make_node("Relu", ["a"], [out])]
    graph = helper.make_graph(nodes, "mlp", [_vi(inp, dims or ["N", 4])], [_vi(out, ["N", 3])], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def cnn(fill: float) -> onnx.ModelProto:
    """Two convolutions, the first one's weights all ``fill`` (inf, nan, huge): the prober's operator norms
    must not fail on them."""
    w1 = numpy_helper.from_array(np.full((4, 3, 3, 3), fill, np.float32), "w1")
    w2 = numpy_helper.from_array(np.full((2, 4, 3, 3), 0.1, np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "cnn", [_vi("x", [1, 3, 8, 8])], [_vi("y", [1, 2, 8, 8])], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def scatter_nd(index: int) -> onnx.ModelProto:
    data = _vi("data", [4, 3])
    idx = numpy_helper.from_array(np.array([[index]], dtype=np.int64), "idx")
    upd = numpy_helper.from_array(np.ones((1, 3), np.float32), "upd")
    node = helper.make_node("ScatterND", ["data", "idx", "upd"], ["out"])
    graph = helper.make_graph([node], "scatter", [data], [_vi("out", [4, 3])], [idx, upd])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def nested_loops(trips: int = 4096, depth: int = 3) -> onnx.ModelProto:
    """``depth`` Loops nested, each ``trips`` iterations, adding 1 to a scalar."""
    def body(level: int) -> onnx.GraphProto:
        ins = [_vi(f"i{level}", [], TensorProto.INT64), _vi(f"c{level}", [], TensorProto.BOOL),
               _vi(f"v{level}", [1])]
        one = helper.make_node("Constant", [], [f"one{level}"], value=numpy_helper.from_array(np.ones(1, np.float32)))
        nodes = [one, helper.make_node("Identity", [f"c{level}"], [f"co{level}"])]
        if level + 1 < depth:
            n = helper.make_node("Constant", [], [f"n{level}"], value=numpy_helper.from_array(np.array(trips)))
            t = helper.make_node("Constant", [], [f"t{level}"], value=numpy_helper.from_array(np.array(True)))
            nodes += [n, t, helper.make_node("Loop", [f"n{level}", f"t{level}", f"v{level}"], [f"inner{level}"],
                                             body=body(level + 1)),
                      helper.make_node("Add", [f"inner{level}", f"one{level}"], [f"vo{level}"])]
        else:
            nodes.append(helper.make_node("Add", [f"v{level}", f"one{level}"], [f"vo{level}"]))
        outs = [_vi(f"co{level}", [], TensorProto.BOOL), _vi(f"vo{level}", [1])]
        return helper.make_graph(nodes, f"body{level}", ins, outs)

    n = numpy_helper.from_array(np.array(trips), "n")
    t = numpy_helper.from_array(np.array(True), "t")
    loop = helper.make_node("Loop", ["n", "t", "x"], ["y"], body=body(0))
    graph = helper.make_graph([loop], "loops", [_vi("x", [1])], [_vi("y", [1])], [n, t])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def endless_loop(trips: int = 10 ** 10) -> str:
    """CIR text: a ``loop`` of ``trips`` iterations over a four-element state, under two negations
    (so the pipeline has something to rewrite, and the verifier something to check)."""
    from cuvil.ir import Builder, DType
    from cuvil.ir.ops.control import INDEX
    from cuvil.ir.region import close_body
    from cuvil.ir.types import TensorType
    from cuvil.ir.values import param

    b = Builder()
    h0 = b.param("h0", DType.f32, [4])
    t, h = param("%t", INDEX), param("%h", TensorType(DType.f32, (4,)))
    body, captured = close_body([t, h], [b.add(b.mul(h, b.const(np.full(4, 0.5, np.float32))), b.relu(h))])
    y = b.loop(h0, *captured, body=body, carried=1, trips=[trips])
    return str(b.module(b.function("main", [h0], [b.neg(b.neg(y))])))


def huge_tile(reps: int) -> onnx.ModelProto:
    r = numpy_helper.from_array(np.array([reps, reps], dtype=np.int64), "r")
    node = helper.make_node("Tile", ["x", "r"], ["y"])
    graph = helper.make_graph([node], "tile", [_vi("x", [2, 2])], [_vi("y", [2 * reps, 2 * reps])], [r])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def huge_expand(dim: int) -> onnx.ModelProto:
    s = numpy_helper.from_array(np.array([dim, dim], dtype=np.int64), "s")
    node = helper.make_node("Expand", ["x", "s"], ["y"])
    graph = helper.make_graph([node], "expand", [_vi("x", [1, 1])], [_vi("y", [dim, dim])], [s])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def duplicate_outputs() -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])]
    graph = helper.make_graph(nodes, "dup", [_vi("x", [2])], [_vi("y", [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def shadowed_input() -> onnx.ModelProto:
    """A graph input that an initializer of the same name also defines (its default value)."""
    m = mlp()
    m.graph.input.append(_vi("b", [3]))
    return m


def _save(model: onnx.ModelProto, folder: Path, name: str = "m.onnx", check: bool = False) -> str:
    path = folder / name
    path.write_bytes(model.SerializeToString())
    return str(path)


def _x(folder: Path, shape: tuple = (2, 4), name: str = "x.npy", dtype: type = np.float32) -> str:
    path = folder / name
    np.save(path, np.random.default_rng(1).standard_normal(shape).astype(dtype))
    return str(path)


# --------------------------------------------------------------------------------------
# command lines over a model


def _commands(model: str, folder: Path) -> dict[str, list[str]]:
    x = _x(folder)
    return {
        "ir": ["ir", model],
        "run-reference": ["run-reference", model, "-i", f"x={x}"],
        "opt": ["opt", model, "-p", "O2"],
        "verify": ["verify", model, "-q", "--timeout", "5", "--jobs", "1"],
        "compile": ["compile", model, "--shape", "x=2x4", "--no-cache", "-o", str(folder / "out" / "libm.so")],
        "probe": ["probe", model, "--range", "x=-1:1", "-q", "--time-limit", "10", "--no-boundary",
                  "--witness-dir", str(folder / "out" / "w")],
    }


def _model_case(name: str, make: Callable[[Path], str], command: str, **kw) -> Case:
    def setup(folder: Path) -> list[str]:
        (folder / "out").mkdir(exist_ok=True)
        return _commands(make(folder), folder)[command]

    return Case(f"{name}/{command}", setup, **kw)


def malformed_models() -> list[Case]:
    valid = mlp().SerializeToString()
    cases: list[Case] = []
    rng = random.Random(7)
    variants: dict[str, Callable[[Path], str]] = {}
    for cut in (0, 1, 7, 20, len(valid) // 3, len(valid) // 2, len(valid) - 5):
        variants[f"truncated-{cut}"] = lambda f, c=cut: _write(f, valid[:c])
    for seed in range(12):
        data = bytearray(valid)
        r = random.Random(seed)
        for _ in range(r.randint(1, 6)):
            data[r.randrange(len(data))] = r.randrange(256)
        variants[f"bitflip-{seed}"] = lambda f, d=bytes(data): _write(f, d)
    variants["garbage"] = lambda f: _write(f, bytes(rng.randrange(256) for _ in range(300)))
    variants["empty-file"] = lambda f: _write(f, b"")
    variants["text-file"] = lambda f: _write(f, b"this is not a model\n")
    variants["directory"] = lambda f: str((f / "model.onnx").mkdir() or f / "model.onnx")
    variants["missing"] = lambda f: str(f / "nope.onnx")
    variants["binary-cir"] = lambda f: _write(f, bytes(range(256)) * 3, "m.cir")
    variants["utf8-garbage-cir"] = lambda f: _write(f, "module { é\x00\x01 }".encode(), "m.cir")
    variants["negative-dim"] = lambda f: _save(mlp(dims=[-5, 4]), f)
    variants["zero-dim"] = lambda f: _save(mlp(dims=[0, 4]), f)
    variants["huge-dim"] = lambda f: _save(mlp(dims=[2 ** 62, 4]), f)
    variants["unknown-op"] = lambda f: _save(_retype(mlp(), "Relu", "FrobnicateX"), f)
    variants["duplicate-outputs"] = lambda f: _save(duplicate_outputs(), f)
    variants["shadowed-input"] = lambda f: _save(shadowed_input(), f)
    variants["opset-99"] = lambda f: _save(_opset(mlp(), 99), f)
    variants["opset-1"] = lambda f: _save(_opset(mlp(), 1), f)
    variants["undefined-input"] = lambda f: _save(_rename_input(mlp(), "h", "nowhere"), f)
    variants["cycle"] = lambda f: _save(_rename_input(mlp(), "h", "y"), f)
    variants["raw-data-short"] = lambda f: _save(_short_raw(mlp()), f)
    variants["external-data-escape"] = lambda f: _save(_external(mlp(), "../../../etc/passwd"), f)
    variants["external-data-absolute"] = lambda f: _save(_external(mlp(), "/etc/passwd"), f)
    for fill in ("inf", "nan", "3e38"):
        variants[f"conv-weights-{fill}"] = lambda f, v=float(fill): _save(cnn(v), f)
    commands = ("ir", "run-reference", "compile", "verify", "opt", "probe")
    for k, (vname, make) in enumerate(variants.items()):
        for j, cmd in enumerate(commands):
            if (k + j) % 2 and vname not in ("directory", "missing", "binary-cir", "duplicate-outputs",
                                               "shadowed-input") and not vname.startswith("conv-weights"):
                continue  # half the command lines per variant keep the campaign short
            cases.append(_model_case(f"malformed/{vname}", make, cmd, tags=("malformed",)))
    return cases


def _write(folder: Path, data: bytes, name: str = "m.onnx") -> str:
    path = folder / name
    path.write_bytes(data)
    return str(path)


def _retype(m: onnx.ModelProto, old: str, new: str) -> onnx.ModelProto:
    for n in m.graph.node:
        if n.op_type == old:
            n.op_type = new
    return m


def _opset(m: onnx.ModelProto, version: int) -> onnx.ModelProto:
    m.opset_import[0].version = version
    return m


def _rename_input(m: onnx.ModelProto, old: str, new: str) -> onnx.ModelProto:
    for n in m.graph.node:
        for k, name in enumerate(n.input):
            if name == old:
                n.input[k] = new
    return m


def _short_raw(m: onnx.ModelProto) -> onnx.ModelProto:
    t = m.graph.initializer[0]
    t.raw_data = t.raw_data[:5]
    return m


def _external(m: onnx.ModelProto, location: str) -> onnx.ModelProto:
    t = m.graph.initializer[0]
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    entry = t.external_data.add()
    entry.key, entry.value = "location", location
    return m


# --------------------------------------------------------------------------------------
# hostile names


HOSTILE_NAMES = [
    'x */ static const char *injected = "pwned"; /*',
    "x\nint injected;\n",
    "x // trailing",
    '"quoted"',
    "x\\",
    "int",
    "x" * 5000,
    "ünïcødé→x",
    "x\x00y",
    "#define x 1",
    "x; system(\"rm -rf /\");",
    "../../evil",
]


INJECTED = ("static const char", "int injected", "system(", "#define x 1")


def _header_is_clean(folder: Path, outcome: object) -> None:
    """No payload of a hostile name appears as code (outside comments and string literals) and
    the header compiles on its own."""
    import subprocess

    for h in (folder / "out").glob("*.h"):
        code = _code_of(h.read_text())
        for payload in INJECTED:
            assert payload not in code, f"{h.name}: {payload!r} escaped into code"
        cc = subprocess.run(["cc", "-fsyntax-only", "-Wall", "-Werror", "-x", "c", str(h)], capture_output=True,
                            text=True, timeout=60)
        assert cc.returncode == 0, cc.stderr[-500:]


def _code_of(c: str) -> str:
    """C source with comments and string literals removed (what the compiler reads as code)."""
    out, k, n = [], 0, len(c)
    while k < n:
        if c.startswith("/*", k):
            end = c.find("*/", k + 2)
            k = n if end < 0 else end + 2
        elif c.startswith("//", k):
            end = c.find("\n", k)
            k = n if end < 0 else end
        elif c[k] == '"':
            k += 1
            while k < n and c[k] != '"':
                k += 2 if c[k] == "\\" else 1
            k += 1
        else:
            out.append(c[k])
            k += 1
    return "".join(out)


def hostile_names() -> list[Case]:
    cases = []
    for k, name in enumerate(HOSTILE_NAMES):
        def setup(folder: Path, name: str = name) -> list[str]:
            (folder / "out").mkdir(exist_ok=True)
            model = _save(mlp(inp=name, out=name + "_out"), folder)
            return ["compile", model, "--shape", f"{name}=2x4", "--no-cache", "-o", str(folder / "out" / "lib.so")]

        cases.append(Case(f"names/input-{k}", setup, check=_header_is_clean, tags=("names",)))

        def setup_name(folder: Path, name: str = name) -> list[str]:
            (folder / "out").mkdir(exist_ok=True)
            model = _save(mlp(), folder)
            return ["compile", model, "--shape", "x=2x4", "--no-cache", "--name", name, "-o",
                    str(folder / "out" / "lib.so")]

        cases.append(Case(f"names/--name-{k}", setup_name, check=_header_is_clean, tags=("names",)))

        def setup_ir(folder: Path, name: str = name) -> list[str]:
            return ["ir", _save(mlp(inp=name, w_name=name + "w"), folder)]

        cases.append(Case(f"names/ir-{k}", setup_ir, tags=("names",)))
    return cases


# --------------------------------------------------------------------------------------
# huge shapes and loops


def huge_shapes() -> list[Case]:
    cases = []
    model = lambda f: _save(mlp(), f)
    for spec in ("x=99999999999999999999x4", "x=0x4", "x=-1x4", "x=2.5x4", "x=abcx4", "x=4611686018427387904x4",
                 "x=2x4x5", "x=", "=2x4", "y=2x4", "x=1e3x4"):
        def setup(folder: Path, spec: str = spec) -> list[str]:
            (folder / "out").mkdir(exist_ok=True)
            return ["compile", model(folder), "--shape", spec, "--no-cache", "-o", str(folder / "out" / "l.so")]

        cases.append(Case(f"shapes/compile-{spec}", setup, tags=("shapes",)))

        def setup_v(folder: Path, spec: str = spec) -> list[str]:
            return ["verify", model(folder), "--shape", spec, "-q", "--jobs", "1"]

        cases.append(Case(f"shapes/verify-{spec}", setup_v, tags=("shapes",)))
    for reps in (2 ** 20, 2 ** 31, 2 ** 40):
        for cmd in ("ir", "compile", "run-reference"):
            def setup_t(folder: Path, reps: int = reps, cmd: str = cmd) -> list[str]:
                (folder / "out").mkdir(exist_ok=True)
                m = _save(huge_tile(reps), folder)
                x = _x(folder, (2, 2))
                return {"ir": ["ir", m], "run-reference": ["run-reference", m, "-i", f"x={x}"],
                        "compile": ["compile", m, "--no-cache", "-o", str(folder / "out" / "l.so")]}[cmd]

            cases.append(Case(f"shapes/tile-{reps}-{cmd}", setup_t, tags=("shapes",)))
    for dim in (2 ** 31, 2 ** 62):
        for cmd in ("ir", "compile"):
            def setup_e(folder: Path, dim: int = dim, cmd: str = cmd) -> list[str]:
                (folder / "out").mkdir(exist_ok=True)
                m = _save(huge_expand(dim), folder)
                return ["ir", m] if cmd == "ir" else ["compile", m, "--no-cache", "-o", str(folder / "out" / "l.so")]

            cases.append(Case(f"shapes/expand-{dim}-{cmd}", setup_e, tags=("shapes",)))
    for cmd in ("ir", "verify", "compile"):
        def setup_l(folder: Path, cmd: str = cmd) -> list[str]:
            (folder / "out").mkdir(exist_ok=True)
            m = _save(nested_loops(), folder)
            return {"ir": ["ir", m], "verify": ["verify", m, "-q", "--jobs", "1"],
                    "compile": ["compile", m, "--no-cache", "-o", str(folder / "out" / "l.so")]}[cmd]

        cases.append(Case(f"shapes/nested-loops-{cmd}", setup_l, expect=("coded error",), limit=90,
                          tags=("shapes", "hang")))
    for cmd, expect in (("run-reference", ("coded error",)), ("verify", ("ok",)), ("compile", ("ok",))):
        def setup_n(folder: Path, cmd: str = cmd) -> list[str]:
            (folder / "out").mkdir(exist_ok=True)
            m = folder / "endless.cir"
            m.write_text(endless_loop())
            x = _x(folder, (4,), "h0.npy")
            return {"run-reference": ["run-reference", str(m), "-i", f"h0={x}"],
                    "verify": ["verify", str(m), "-q", "--jobs", "1"],
                    "compile": ["compile", str(m), "--no-cache", "-o", str(folder / "out" / "l.so")]}[cmd]

        cases.append(Case(f"shapes/endless-loop-{cmd}", setup_n, expect=expect, limit=90, tags=("shapes", "hang")))
    return cases


# --------------------------------------------------------------------------------------
# corrupt artifacts and manifests


_ARTIFACT: dict[str, Path] = {}


def _artifact(folder: Path) -> tuple[Path, Path]:
    """A compiled library and its manifest, copied into ``folder/out``."""
    if "lib" not in _ARTIFACT:
        import tempfile

        from cuvil.cli import main

        root = Path(tempfile.mkdtemp(prefix="cuvil-hostile-artifact-"))
        atexit.register(shutil.rmtree, root, True)  # (built once per process, shared by its cases)
        model = _save(mlp(), root)
        assert main(["compile", model, "--shape", "x=2x4", "--no-cache", "--gate",
                     "-o", str(root / "libm.so")]) == 0
        _ARTIFACT["lib"] = root / "libm.so"
        _ARTIFACT["manifest"] = root / "m.json"
    out = folder / "out"
    out.mkdir(exist_ok=True)
    for f in _ARTIFACT["lib"].parent.iterdir():
        if f.suffix in (".so", ".json", ".h"):
            shutil.copy(f, out / f.name)
    return out / "libm.so", out / "m.json"


def _edit_manifest(edit: Callable[[dict], None]) -> Callable[[Path], tuple[Path, Path]]:
    def make(folder: Path) -> tuple[Path, Path]:
        lib, man = _artifact(folder)
        data = json.loads(man.read_text())
        edit(data)
        man.write_text(json.dumps(data))
        return lib, man

    return make


def _set(path: list, value: object) -> Callable[[dict], None]:
    def edit(d: dict) -> None:
        node = d
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value

    return edit


def _delete(key: str) -> Callable[[dict], None]:
    return lambda d: d.pop(key, None)


def corrupt_artifacts() -> list[Case]:
    edits: dict[str, Callable[[Path], tuple[Path, Path]]] = {
        "intact": _edit_manifest(lambda d: None),
        "create-abort": _edit_manifest(_set(["symbols", "create"], "abort")),
        "run-exit": _edit_manifest(_set(["symbols", "run_checked"], "exit")),
        "library-traversal": _edit_manifest(_set(["library"], "../../../../bin/ls")),
        "inputs-not-list": _edit_manifest(_set(["inputs"], "x")),
        "input-shape-huge": _edit_manifest(lambda d: d["inputs"][0].__setitem__("shape", [2 ** 62, 4])),
        "input-dtype-unknown": _edit_manifest(lambda d: d["inputs"][0].__setitem__("dtype", "complex256")),
        "outputs-empty": _edit_manifest(_set(["outputs"], [])),
        "abi-version": _edit_manifest(_set(["abi_version"], 999)),
        "no-symbols": _edit_manifest(_delete("symbols")),
        "no-library-hash": _edit_manifest(_delete("library_sha256")),
        "hash-null": _edit_manifest(_set(["library_sha256"], None)),
        "verification-garbage": _edit_manifest(_set(["verification"], {"format": 3})),
        "summary-edited": _edit_manifest(lambda d: d["verification"]["summary"].__setitem__("unknown", 5)),
        "prefix-injected": _edit_manifest(_set(["symbol_prefix"], "x; rm -rf /")),
    }

    def not_json(folder: Path) -> tuple[Path, Path]:
        lib, man = _artifact(folder)
        man.write_text("{not json")
        return lib, man

    def flipped(folder: Path) -> tuple[Path, Path]:
        lib, man = _artifact(folder)
        data = bytearray(lib.read_bytes())
        data[len(data) // 3] ^= 0x5A
        lib.write_bytes(bytes(data))
        return lib, man

    def truncated(folder: Path) -> tuple[Path, Path]:
        lib, man = _artifact(folder)
        lib.write_bytes(lib.read_bytes()[:1000])
        return lib, man

    def no_manifest(folder: Path) -> tuple[Path, Path]:
        lib, man = _artifact(folder)
        man.unlink()
        return lib, man

    edits.update({"manifest-not-json": not_json, "library-flipped": flipped, "library-truncated": truncated,
                  "manifest-missing": no_manifest})
    cases = []
    for name, make in edits.items():
        for cmd in ("run", "verify-artifact", "check-certificate"):
            def setup(folder: Path, make: Callable = make, cmd: str = cmd) -> list[str]:
                lib, _ = make(folder)
                x = _x(folder)
                return {"run": ["run", str(lib), "-i", f"x={x}"],
                        "verify-artifact": ["verify", "--artifact", str(lib)],
                        "check-certificate": ["verify", "--check-certificate", str(lib), "-q"]}[cmd]

            expect = ANY if name == "intact" else ("check failed", "coded error")
            cases.append(Case(f"artifact/{name}/{cmd}", setup, expect=expect, tags=("artifact",)))
    return cases


# --------------------------------------------------------------------------------------
# command-line misuse


PLUGINS = {
    "import_error.py": "raise ImportError('missing helper')\n",
    "syntax_error.py": "def broken(:\n",
    "raises_at_import.py": "raise RuntimeError('boom at import')\n",
    "not_a_pass.py": "class P:\n    name = 'p'\n",
    "raises_in_run.py": ("from dataclasses import dataclass\nfrom cuvil.passes import Pass\n"
                         "@dataclass(frozen=True)\nclass P(Pass):\n    name = 'raises'\n"
                         "    def run(self, module):\n        raise ValueError('pass bug')\n"),
    "returns_junk.py": ("from dataclasses import dataclass\nfrom cuvil.passes import Pass\n"
                        "@dataclass(frozen=True)\nclass P(Pass):\n    name = 'junk'\n"
                        "    def run(self, module):\n        return 42\n"),
    "loops_forever.py": ("from dataclasses import dataclass\nfrom cuvil.passes import Pass\n"
                         "@dataclass(frozen=True)\nclass P(Pass):\n    name = 'forever'\n"
                         "    def run(self, module):\n        while True:\n            pass\n"),
    "needs_args.py": ("from dataclasses import dataclass\nfrom cuvil.passes import Pass\n"
                      "@dataclass(frozen=True)\nclass P(Pass):\n    k: int\n    name = 'needs'\n"),
}


def cli_misuse() -> list[Case]:
    cases: list[Case] = []

    def m(folder: Path) -> str:
        return _save(mlp(), folder)

    simple: dict[str, Callable[[Path], list[str]]] = {
        "no-command": lambda f: [],
        "unknown-command": lambda f: ["frobnicate"],
        "help": lambda f: ["--help"],
        "verify-timeout-nan": lambda f: ["verify", m(f), "--timeout", "nan", "-q"],
        "verify-timeout-negative": lambda f: ["verify", m(f), "--timeout", "-1", "-q"],
        "verify-timeout-inf": lambda f: ["verify", m(f), "--timeout", "inf", "-q", "--jobs", "1"],
        "verify-jobs-zero": lambda f: ["verify", m(f), "--jobs", "0"],
        "verify-jobs-negative": lambda f: ["verify", m(f), "--jobs", "-3"],
        "verify-json-missing-dir": lambda f: ["verify", m(f), "-q", "--jobs", "1", "--json", str(f / "no" / "c.json")],
        "verify-json-is-dir": lambda f: ["verify", m(f), "-q", "--jobs", "1", "--json", str(f)],
        "verify-sarif-missing-dir": lambda f: ["verify", m(f), "-q", "--jobs", "1", "--sarif", str(f / "no" / "s")],
        "verify-html-missing-dir": lambda f: ["verify", m(f), "-q", "--jobs", "1", "--html", str(f / "no" / "h")],
        "verify-two-modes": lambda f: ["verify", m(f), "--rules"],
        "verify-O-and-p": lambda f: ["verify", m(f), "-O2", "-p", "O2"],
        "verify-unknown-pass": lambda f: ["verify", m(f), "-p", "no-such-pass"],
        "verify-bad-pipeline": lambda f: ["verify", m(f), "-p", ",,,"],
        "verify-solver-bogus": lambda f: ["verify", "--check-certificate", m(f), "--solver", "yices"],
        "check-certificate-not-json": lambda f: ["verify", "--check-certificate", m(f)],
        "check-certificate-missing": lambda f: ["verify", "--check-certificate", str(f / "nope.json")],
        "check-certificate-list": lambda f: ["verify", "--check-certificate", _text(f, "c.json", "[1, 2]")],
        "check-certificate-empty-object": lambda f: ["verify", "--check-certificate", _text(f, "c.json", "{}")],
        "probe-range-duplicate": lambda f: ["probe", m(f), "--range", "x=-1:1", "--range", "x=0:2", "-q"],
        "probe-range-malformed": lambda f: ["probe", m(f), "--range", "x=1", "-q"],
        "probe-range-nan": lambda f: ["probe", m(f), "--range", "x=nan:1", "-q"],
        "probe-range-unknown-input": lambda f: ["probe", m(f), "--range", "z=0:1", "-q"],
        "probe-time-limit-nan": lambda f: ["probe", m(f), "--range", "x=-1:1", "--time-limit", "nan", "-q"],
        "probe-time-limit-negative": lambda f: ["probe", m(f), "--range", "x=-1:1", "--time-limit", "-5", "-q"],
        "probe-keep-fp32-unknown": lambda f: ["probe", m(f), "--range", "x=-1:1", "--keep-fp32", "frob", "-q"],
        "probe-dim-malformed": lambda f: ["probe", m(f), "--range", "x=-1:1", "--dim", "N", "-q"],
        "probe-json-missing-dir": lambda f: ["probe", m(f), "--range", "x=-1:1", "-q", "--time-limit", "10",
                                             "--no-boundary", "--json", str(f / "no" / "r.json")],
        "compile-output-missing-dir": lambda f: ["compile", m(f), "--shape", "x=2x4", "--no-cache", "-o",
                                                 str(f / "no" / "such" / "lib.so")],
        "compile-output-is-dir": lambda f: ["compile", m(f), "--shape", "x=2x4", "--no-cache", "-o", str(f)],
        "compile-output-json": lambda f: ["compile", m(f), "--shape", "x=2x4", "--no-cache", "-o",
                                          str(f / "out" / "x.json")],
        "compile-target-arm": lambda f: ["compile", m(f), "--target", "aarch64-linux-gnu", "--no-cache"],
        "compile-threads-zero": lambda f: ["compile", m(f), "--shape", "x=2x4", "--threads", "0", "--no-cache",
                                           "-o", str(f / "out" / "l.so")],
        "compile-opt-level-bogus": lambda f: ["compile", m(f), "--opt-level", "O9"],
        "compile-range-without-fp16": lambda f: ["compile", m(f), "--range", "x=0:1", "--shape", "x=2x4",
                                                 "--no-cache", "-o", str(f / "out" / "l.so")],
        "run-missing-library": lambda f: ["run", str(f / "lib.so")],
        "run-reference-missing-input": lambda f: ["run-reference", m(f)],
        "run-reference-wrong-shape": lambda f: ["run-reference", m(f), "-i", f"x={_x(f, (3, 5))}"],
        "run-reference-wrong-dtype": lambda f: ["run-reference", m(f), "-i", f"x={_x(f, (2, 4), dtype=np.int64)}"],
        "run-reference-object-array": lambda f: ["run-reference", m(f), "-i", f"x={_object_npy(f)}"],
        "run-reference-corrupt-npz": lambda f: ["run-reference", m(f), "-i", _write(f, b"PK\x03\x04garbage", "i.npz")],
        "run-reference-huge-npy-header": lambda f: ["run-reference", m(f), "-i", f"x={_huge_header(f)}"],
        "run-reference-npy-is-dir": lambda f: ["run-reference", m(f), "-i", f"x={f}"],
        "run-reference-output-dir-is-file": lambda f: ["run-reference", m(f), "-i", f"x={_x(f)}", "-o", m(f)],
        "ir-output-missing-dir": lambda f: ["ir", m(f), "-o", str(f / "no" / "m.cir")],
        "opt-print-after-unknown": lambda f: ["opt", m(f), "-p", "O2", "--print-after", "nope"],
        "ops-json": lambda f: ["ops", "--json"],
        "closed-stdout-ops": lambda f: ["ops"],
        "closed-stdout-ir": lambda f: ["ir", m(f)],
        "closed-stdout-verify": lambda f: ["verify", m(f), "--jobs", "1"],
    }
    for name, setup in simple.items():
        def wrapped(folder: Path, setup: Callable = setup) -> list[str]:
            (folder / "out").mkdir(exist_ok=True)
            return setup(folder)

        cases.append(Case(f"cli/{name}", wrapped, close_stdout=name.startswith("closed-stdout"), tags=("cli",)))
    for plugin in PLUGINS:
        for cmd in ("verify", "compile"):
            def setup_p(folder: Path, plugin: str = plugin, cmd: str = cmd) -> list[str]:
                (folder / "out").mkdir(exist_ok=True)
                (folder / plugin).write_text(PLUGINS[plugin])
                spec = f"{plugin[:-3]}:P"
                model = m(folder)
                limit = ["--pass-time-limit", "3"]
                if cmd == "verify":
                    return ["verify", model, "--pass-plugin", spec, *limit, "-q", "--jobs", "1"]
                return ["compile", model, "--shape", "x=2x4", "--no-cache", "--gate", "--pass-plugin", spec, *limit,
                        "-o", str(folder / "out" / "l.so")]

            cases.append(Case(f"cli/plugin-{plugin[:-3]}-{cmd}", setup_p, limit=90, tags=("cli", "plugin")))
    return cases


def _text(folder: Path, name: str, text: str) -> str:
    path = folder / name
    path.write_text(text)
    return str(path)


def _object_npy(folder: Path) -> str:
    path = folder / "obj.npy"
    np.save(path, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    return str(path)


def _huge_header(folder: Path) -> str:
    path = folder / "huge.npy"
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4), " + " " * 200_000 + "}\n"
    path.write_bytes(b"\x93NUMPY\x02\x00" + len(header).to_bytes(4, "little") + header.encode() + b"\0" * 32)
    return str(path)


def all_cases() -> list[Case]:
    return [*malformed_models(), *hostile_names(), *huge_shapes(), *corrupt_artifacts(), *cli_misuse()]
