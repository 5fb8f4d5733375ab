"""The safetensors reader on good and hostile files: every dtype round-trips bit for bit as a read-only
memory map, files agree with the ``safetensors`` package both ways, and a damaged or hostile header is
refused with ``AdapterError`` (never another exception, never a read of a claimed huge header)."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from lora.errors import AdapterError
from lora.safetensors_file import DTYPES, MAX_HEADER_BYTES, SafetensorsFile, write_safetensors

safetensors = pytest.importorskip("safetensors", reason="safetensors comes with the dev extra")
safetensors_numpy = pytest.importorskip("safetensors.numpy")
safetensors_torch = pytest.importorskip("safetensors.torch")
torch = pytest.importorskip("torch")


def sample(dtype: np.dtype, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Values covering the type: for floats also NaN, infinities, -0.0 and subnormals."""
    rng = np.random.default_rng(seed)
    size = int(np.prod(shape))
    if dtype == np.dtype(np.bool_):
        return rng.integers(0, 2, size).astype(np.bool_).reshape(shape)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size, dtype=dtype, endpoint=True).reshape(shape)
    values = rng.standard_normal(size) * 100
    info = ml_dtypes.finfo(dtype)  # (numpy's finfo knows bfloat16 only through some ml_dtypes versions)
    special = [np.nan, np.inf, -np.inf, -0.0, float(info.smallest_subnormal), float(info.max)]
    values[: min(size, len(special))] = special[: min(size, len(special))]
    return values.astype(dtype).reshape(shape)


def assert_same(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    assert np.ascontiguousarray(ours).tobytes() == np.ascontiguousarray(theirs).tobytes()


# -- good files --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(DTYPES))
def test_every_dtype_round_trips_bit_for_bit_as_a_read_only_map(tmp_path: Path, name: str) -> None:
    dtype = DTYPES[name]
    tensors = {"matrix": sample(dtype, (5, 7)), "odd": sample(dtype, (3,), seed=1), "cube": sample(dtype, (2, 3, 4)),
               "empty": np.zeros((0, 4), dtype)}
    path = tmp_path / "t.safetensors"
    write_safetensors(path, tensors, {"format": "pt", "name": name})
    f = SafetensorsFile(path)
    assert list(f) == list(tensors) and f.metadata == {"format": "pt", "name": name}
    assert f.data_start % 8 == 0  # the header is padded so that every dtype's data is aligned
    for key, value in tensors.items():
        assert f.tensors[key].dtype == dtype and f.tensors[key].shape == value.shape
        array = f.array(key)
        assert_same(array, value)
        if value.size:
            assert isinstance(array, np.memmap) and not array.flags.writeable
            with pytest.raises(ValueError, match="read-only"):
                array[(0,) * array.ndim] = array[(0,) * array.ndim]


def test_a_scalar_round_trips_as_a_scalar(tmp_path: Path) -> None:
    write_safetensors(tmp_path / "t.safetensors", {"scale": np.array(0.5, np.float32)})
    assert SafetensorsFile(tmp_path / "t.safetensors").array("scale").shape == ()


NUMPY_DTYPES = [name for name in DTYPES if name != "BF16"]  # safetensors.numpy has no bfloat16


def test_files_the_package_writes_read_as_the_package_reads_them(tmp_path: Path) -> None:
    tensors = {f"{name.lower()}.{k}": sample(DTYPES[name], shape, seed=k)
               for name in NUMPY_DTYPES for k, shape in enumerate([(4, 3), (), (0, 2), (2, 1, 5)])}
    path = tmp_path / "package.safetensors"
    safetensors_numpy.save_file(tensors, str(path), metadata={"format": "np"})
    oracle = safetensors_numpy.load_file(str(path))
    f = SafetensorsFile(path)
    assert set(f) == set(oracle) and f.metadata == {"format": "np"}
    for key, value in oracle.items():
        assert_same(np.asarray(f.array(key)), value)


def test_bfloat16_the_package_writes_reads_as_torch_reads_it(tmp_path: Path) -> None:
    value = torch.randn(6, 5, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    path = tmp_path / "bf16.safetensors"
    safetensors_torch.save_file({"w": value}, str(path))
    ours = SafetensorsFile(path).array("w")
    assert ours.dtype == np.dtype(ml_dtypes.bfloat16)
    assert ours.view(np.int16).tolist() == value.view(torch.int16).tolist()


def test_files_written_here_read_in_the_package(tmp_path: Path) -> None:
    tensors = {name: sample(DTYPES[name], (3, 4)) for name in NUMPY_DTYPES}
    path = tmp_path / "ours.safetensors"
    write_safetensors(path, tensors, {"format": "pt"})
    for key, value in safetensors_numpy.load_file(str(path)).items():
        assert_same(value, tensors[key])
    with safetensors.safe_open(str(path), "np") as f:
        assert f.metadata() == {"format": "pt"}
    bf16 = sample(DTYPES["BF16"], (3, 4))
    write_safetensors(path, {"w": bf16})
    assert safetensors_torch.load_file(str(path))["w"].view(torch.int16).tolist() == bf16.view(np.int16).tolist()


# -- hostile files -----------------------------------------------------------------------------------------------

ENTRY = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}


def file_bytes(header: Any, data: bytes = bytes(16), *, claimed: int | None = None) -> bytes:
    """A safetensors file: 8-byte little-endian header length (``claimed`` if given), header, data."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if claimed is None else claimed) + raw + data


def with_entry(**changes: Any) -> bytes:
    return file_bytes({"w": {**ENTRY, **changes}})


def _valid() -> bytes:
    return file_bytes({"__metadata__": {"format": "pt"}, "w": ENTRY, "b": {**ENTRY, "data_offsets": [16, 32]}},
                      bytes(32))


def _truncated(at: int) -> bytes:
    return _valid()[:at]


Hostile = Callable[[], bytes]
HOSTILE: dict[str, tuple[Hostile, str]] = {
    "empty-file": (lambda: b"", "shorter than a safetensors header"),
    "cut-in-length": (lambda: _truncated(5), "shorter than a safetensors header"),
    "cut-in-header": (lambda: _truncated(40), "ends inside its header"),
    "cut-in-data": (lambda: _truncated(len(_valid()) - 3), "outside the file's 29 data bytes"),
    "header-longer-than-file": (lambda: file_bytes({"w": ENTRY}, claimed=10_000), "ends inside its header"),
    "header-not-json": (lambda: file_bytes(b"{'w': 1}"), "the header is not JSON"),
    "header-not-utf8": (lambda: file_bytes(b'{"\xff": 1}'), "the header is not JSON"),
    "header-empty": (lambda: file_bytes(b""), "the header is not JSON"),
    "header-list": (lambda: file_bytes([ENTRY]), "the header is not a JSON object"),
    "header-number": (lambda: file_bytes(b"16"), "the header is not a JSON object"),
    "entry-not-object": (lambda: file_bytes({"w": [0, 16]}), "the entry of 'w' is not an object"),
    "dtype-unknown": (lambda: with_entry(dtype="F128"), "tensor 'w' has the unsupported dtype 'F128'"),
    "dtype-missing": (lambda: file_bytes({"w": {"shape": [4], "data_offsets": [0, 16]}}), "unsupported dtype None"),
    "shape-negative": (lambda: with_entry(shape=[-2, -2]), "tensor 'w' has the malformed shape [-2, -2]"),
    "shape-float": (lambda: with_entry(shape=[2.0, 2]), "malformed shape [2.0, 2]"),
    "shape-string": (lambda: with_entry(shape=["2", 2]), "malformed shape ['2', 2]"),
    "shape-bool": (lambda: with_entry(shape=[True, 4]), "malformed shape [True, 4]"),
    "shape-not-list": (lambda: with_entry(shape=4), "malformed shape 4"),
    "offsets-past-end": (lambda: with_entry(data_offsets=[0, 20]), "data offsets [0, 20] outside the file's 16"),
    "offsets-reversed": (lambda: with_entry(data_offsets=[16, 0]), "data offsets [16, 0]"),
    "offsets-negative": (lambda: with_entry(data_offsets=[-4, 12]), "data offsets [-4, 12]"),
    "offsets-three": (lambda: with_entry(data_offsets=[0, 8, 16]), "data offsets [0, 8, 16]"),
    "offsets-float": (lambda: with_entry(data_offsets=[0, 16.0]), "data offsets [0, 16.0]"),
    "offsets-missing": (lambda: file_bytes({"w": {"dtype": "F32", "shape": [4]}}), "data offsets None"),
    "span-short": (lambda: with_entry(data_offsets=[0, 12]), "needs 16 bytes, its offsets span 12"),
    "span-long": (lambda: with_entry(shape=[3], data_offsets=[0, 16]), "needs 12 bytes, its offsets span 16"),
    "overlap": (lambda: file_bytes({"a": ENTRY, "b": {**ENTRY, "data_offsets": [8, 24]}}, bytes(24)),
                "tensors 'a' and 'b' overlap"),
    "overlap-inside": (lambda: file_bytes({"a": {**ENTRY, "shape": [8], "data_offsets": [0, 32]},
                                           "b": {**ENTRY, "shape": [2], "data_offsets": [20, 28]},
                                           "c": {**ENTRY, "shape": [1], "data_offsets": [28, 32]}}, bytes(32)),
                       "tensors 'a' and 'b' overlap"),
    "overlap-same": (lambda: file_bytes({"a": ENTRY, "b": ENTRY}), "tensors 'a' and 'b' overlap"),
}


HOSTILE_EDGES: dict[str, tuple[Hostile, str, str]] = {
    # files that once crashed the reader instead of being refused (the third field says how)
    "shape-product-wraps": (lambda: with_entry(shape=[2**32, 2**32], data_offsets=[0, 0]), "shape",
                            "the element count is np.prod(..., int64), which wraps to 0 for 2**64 elements: the "
                            "header is accepted and array() raises ValueError"),
    "shape-dim-beyond-int64": (lambda: with_entry(shape=[2**70], data_offsets=[0, 0]), "shape",
                               "np.prod(..., int64) raises OverflowError for a dim beyond int64"),
    "metadata-list": (lambda: file_bytes({"__metadata__": [1, 2], "w": ENTRY}), "__metadata__",
                      "a non-object __metadata__ raises AttributeError ('.items()')"),
    "metadata-string": (lambda: file_bytes({"__metadata__": "pt", "w": ENTRY}), "__metadata__",
                        "a non-object __metadata__ raises AttributeError ('.items()')"),
    "header-deeply-nested": (lambda: file_bytes(b"[" * 100_000 + b"]" * 100_000), "JSON",
                             "json.loads raises RecursionError on deep nesting, which is not caught"),
    "header-huge-integer": (lambda: file_bytes(b'{"w": {"dtype": "F32", "shape": [' + b"1" * 5000
                                               + b'], "data_offsets": [0, 16]}}'), "JSON",
                            "json.loads raises ValueError (int max str digits), not JSONDecodeError, uncaught"),
    "offsets-bool": (lambda: with_entry(dtype="U8", shape=[1], data_offsets=[False, True]), "offsets",
                     "data offsets accept JSON booleans as 0 and 1 (the shape check refuses them)"),
}


def _refused(tmp_path: Path, content: bytes) -> AdapterError:
    path = tmp_path / "hostile.safetensors"
    path.write_bytes(content)
    with pytest.raises(AdapterError) as info:
        SafetensorsFile(path)
    assert info.value.code == "CUVIL-LORA" and info.value.location == str(path)
    assert info.value.message.startswith("hostile.safetensors: ")
    return info.value


def test_the_valid_file_the_hostile_ones_start_from_is_read(tmp_path: Path) -> None:
    (tmp_path / "valid.safetensors").write_bytes(_valid())
    f = SafetensorsFile(tmp_path / "valid.safetensors")
    assert list(f) == ["w", "b"] and f.metadata == {"format": "pt"}
    assert f.array("b").tolist() == [[0.0, 0.0], [0.0, 0.0]]
    (tmp_path / "adjacent.safetensors").write_bytes(
        file_bytes({"a": ENTRY, "e": {**ENTRY, "shape": [0], "data_offsets": [16, 16]}, "b": {**ENTRY,
                    "data_offsets": [16, 32]}}, bytes(32)))
    assert set(SafetensorsFile(tmp_path / "adjacent.safetensors")) == {"a", "e", "b"}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_file_is_refused_with_the_reason(tmp_path: Path, case: str) -> None:
    content, words = HOSTILE[case]
    assert words in _refused(tmp_path, content()).message


@pytest.mark.parametrize("case", list(HOSTILE_EDGES))
def test_a_hostile_file_is_refused_not_crashed_on(tmp_path: Path, case: str) -> None:
    content, words, _ = HOSTILE_EDGES[case]
    assert words in _refused(tmp_path, content()).message


@pytest.mark.parametrize("case", [*HOSTILE, *HOSTILE_EDGES])
def test_the_package_refuses_the_hostile_files_too(tmp_path: Path, case: str) -> None:
    """Each hostile file is one the format forbids, not one the reader is merely stricter about."""
    path = tmp_path / "hostile.safetensors"
    path.write_bytes((HOSTILE[case][0] if case in HOSTILE else HOSTILE_EDGES[case][0])())
    with pytest.raises(safetensors.SafetensorError), safetensors.safe_open(str(path), "np"):
        pass


class _RecordingFile:
    """A file whose reads are recorded, to see how much of a hostile file is read."""

    def __init__(self, path: Path, reads: list[int]) -> None:
        self._file = open(path, "rb")
        self._reads = reads

    def __enter__(self) -> _RecordingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()

    def read(self, size: int = -1) -> bytes:
        self._reads.append(size)
        return self._file.read(size)


@pytest.mark.parametrize("claimed", [MAX_HEADER_BYTES + 1, 2**40, 2**64 - 1])
def test_a_huge_claimed_header_is_refused_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 claimed: int) -> None:
    reads: list[int] = []
    monkeypatch.setattr("lora.safetensors_file.open", lambda path, mode: _RecordingFile(path, reads), raising=False)
    error = _refused(tmp_path, file_bytes({"w": ENTRY}, claimed=claimed))
    assert f"the header claims {claimed} bytes" in error.message
    assert reads == [8]


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(AdapterError, match=r"absent\.safetensors is missing") as info:
        SafetensorsFile(tmp_path / "absent.safetensors")
    assert info.value.location == str(tmp_path)
