"""The artifact cache: reuse across processes, one build under concurrency, tamper detection,
private directories, and what the key depends on."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from runtime_models import SCALE, scaled_softmax, softmax_module

import cuvil.compiler.job as compile_job
import cuvil.compiler.keys as compile_keys
import cuvil.compiler.targets as compile_targets
import cuvil.runtime.loader as loader
from cuvil.codegen.artifact import file_sha256
from cuvil.codegen.target import Target
from cuvil.compiler import compile
from cuvil.runtime.cache import ArtifactCache, CacheError, UnsafeCacheError

WORKER = Path(__file__).with_name("cache_worker.py")
X = np.linspace(-2.0, 2.0, 32, dtype=np.float32).reshape(4, 8)


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Records every library build in this process (the output folder of each)."""
    seen: list[Path] = []
    real = compile_job.build_library

    def counting(fn, constants, out_dir, **kwargs):
        seen.append(Path(out_dir))
        return real(fn, constants, out_dir, **kwargs)

    monkeypatch.setattr(compile_job, "build_library", counting)
    return seen


def _worker(sync: Path, role: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(WORKER), str(sync), role, *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ), cwd=str(WORKER.parent))


def _report(proc: subprocess.Popen[str]) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _same_sources(run: Callable[[], list[dict]]) -> list[dict]:
    """``run()``'s reports, retried while cuvil's sources changed between its processes
    (the key includes them, so an edit during the run rightly makes a new entry)."""
    for _ in range(3):
        reports = run()
        if len({r["sources"] for r in reports}) == 1:
            return reports
    pytest.skip("cuvil's sources kept changing while the test ran")


# --------------------------------------------------------------------------------------
# reuse


def test_second_process_reuses_the_library(tmp_path, private_cache):
    def run() -> list[dict]:
        ArtifactCache(private_cache).clear()
        return [_report(_worker(tmp_path, "solo")), _report(_worker(tmp_path, "solo"))]

    first, second = _same_sources(run)
    assert first["ok"] and second["ok"]
    assert (first["built"], first["cache"]) == (1, "miss")
    assert (second["built"], second["cache"]) == (0, "hit")
    assert first["library"] == second["library"]
    assert Path(second["library"]).is_relative_to(private_cache)
    print(f"cache hit in a fresh process: compile() took {second['compile_s']:.3f} s "
          f"(cold: {first['compile_s']:.3f} s)")


def test_in_process_hit_does_not_build(builds):
    a = compile(softmax_module())
    b = compile(softmax_module())
    assert len(builds) == 1
    assert (a.cache_info["cache"], b.cache_info["cache"]) == ("miss", "hit")
    np.testing.assert_allclose(b(X), scaled_softmax(X), rtol=1e-5, atol=1e-7)


def test_follower_waits_for_the_leaders_build(tmp_path, private_cache):
    def run() -> list[dict]:
        ArtifactCache(private_cache).clear()
        for name in ("building", "follower-started"):
            (tmp_path / name).unlink(missing_ok=True)
        leader = _worker(tmp_path, "leader")
        follower = _worker(tmp_path, "follower")
        return [_report(leader), _report(follower)]

    lead, follow = _same_sources(run)
    assert lead["ok"] and follow["ok"]
    assert lead["built"] == 1 and lead["cache"] == "miss"
    assert follow["built"] == 0 and follow["cache"] == "hit", follow
    assert lead["library"] == follow["library"]
    assert len(ArtifactCache(private_cache).keys()) == 1


def test_processes_racing_build_once(tmp_path, private_cache):
    def run() -> list[dict]:
        ArtifactCache(private_cache).clear()
        for p in tmp_path.glob("ready-*"):
            p.unlink()
        procs = [_worker(tmp_path, "racer", "3", str(k)) for k in range(3)]
        return [_report(p) for p in procs]

    reports = _same_sources(run)
    assert all(r["ok"] for r in reports)
    assert sum(r["built"] for r in reports) == 1, reports
    assert sorted(r["cache"] for r in reports) == ["hit", "hit", "miss"]
    assert len({r["library"] for r in reports}) == 1
    assert len(ArtifactCache(private_cache).keys()) == 1
    assert not any((private_cache / "v1" / "tmp").iterdir())  # no staging folders left behind


# --------------------------------------------------------------------------------------
# integrity


def test_tampered_library_is_rebuilt_and_never_loaded(builds, monkeypatch, caplog):
    first = compile(softmax_module())
    path = first.library_path
    assert path is not None
    first.close()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    swapped = path.with_name("swapped.tmp")  # a new file in its place (this process still maps the old one)
    swapped.write_bytes(bytes(data))
    os.replace(swapped, path)
    tampered = file_sha256(path)

    loaded: list[str] = []
    real_dlopen = loader._dlopen

    def spy(p: Path):
        loaded.append(file_sha256(Path(p)))
        return real_dlopen(p)

    monkeypatch.setattr(loader, "_dlopen", spy)
    with caplog.at_level("WARNING", logger="cuvil"):
        again = compile(softmax_module())
    assert tampered not in loaded and loaded
    assert again.cache_info["cache"] == "miss" and len(builds) == 2
    assert again.library_path != path
    assert file_sha256(again.library_path) == again.manifest["library_sha256"] != tampered
    assert any("SHA-256" in r.getMessage() for r in caplog.records)
    np.testing.assert_allclose(again(X), scaled_softmax(X), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("damage", ["record", "manifest", "symlink", "missing"])
def test_damaged_entries_are_rebuilt(builds, damage, tmp_path):
    first = compile(softmax_module())
    entry = first.library_path.parent
    first.close()
    if damage == "record":
        (entry.parent / "entry.json").write_text("{not json")
    elif damage == "manifest":
        man = next(p for p in entry.glob("*.json") if p.name != "entry.json")
        man.write_text(json.dumps({**json.loads(man.read_text()), "library_sha256": "0" * 64}))
    elif damage == "symlink":
        outside = tmp_path / "elsewhere.so"
        outside.write_bytes(first.library_path.read_bytes())
        first.library_path.unlink()
        first.library_path.symlink_to(outside)
    else:
        first.library_path.unlink()
    again = compile(softmax_module())
    assert again.cache_info["cache"] == "miss" and len(builds) == 2
    assert not again.library_path.is_symlink()
    np.testing.assert_allclose(again(X), scaled_softmax(X), rtol=1e-5, atol=1e-7)


# --------------------------------------------------------------------------------------
# the directory


def test_cache_directory_is_created_private(private_cache):
    compile(softmax_module())
    assert stat.S_IMODE(private_cache.stat().st_mode) == 0o700
    for sub in ("v1", "v1/entries", "v1/locks", "v1/tmp", "v1/aliases"):
        assert stat.S_IMODE((private_cache / sub).stat().st_mode) == 0o700, sub


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o722])
def test_directory_writable_by_others_is_refused(private_cache, mode):
    private_cache.mkdir()
    os.chmod(private_cache, mode)
    with pytest.raises(UnsafeCacheError, match="writable by other users") as err:
        compile(softmax_module())
    assert err.value.code == "CUVIL-CACHE-UNSAFE" and "chmod 700" in err.value.hint
    assert not any(private_cache.iterdir())  # nothing was written into it


def test_symlink_to_a_shared_directory_is_refused(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    link = tmp_path / "link"
    link.symlink_to(shared)
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(link))
    with pytest.raises(UnsafeCacheError):
        compile(softmax_module())


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_directory_owned_by_another_user_is_refused(private_cache):
    private_cache.mkdir(mode=0o700)
    os.chown(private_cache, 65534, 65534)
    with pytest.raises(UnsafeCacheError, match="owned by uid 65534"):
        compile(softmax_module())


def test_unsafe_subdirectory_is_refused(private_cache):
    ArtifactCache(private_cache)
    os.chmod(private_cache / "v1" / "entries", 0o777)
    with pytest.raises(UnsafeCacheError):
        ArtifactCache(private_cache)


def test_cache_path_that_is_a_file_is_refused(private_cache):
    private_cache.write_text("not a directory")
    with pytest.raises(CacheError):
        compile(softmax_module())


def test_bypassing_the_cache_leaves_it_untouched(private_cache, tmp_path):
    private_cache.mkdir()
    os.chmod(private_cache, 0o777)  # unsafe, but never opened
    m1 = compile(softmax_module(), cache=False)
    m2 = compile(softmax_module(), output_dir=tmp_path / "out")
    assert m1.cache_info["cache"] == m2.cache_info["cache"] == "off"
    assert m2.library_path.parent == tmp_path / "out"
    assert not any(private_cache.iterdir())
    np.testing.assert_allclose(m1(X), scaled_softmax(X), rtol=1e-5, atol=1e-7)


# --------------------------------------------------------------------------------------
# the key


def test_key_follows_options_constants_and_cpu(builds, monkeypatch):
    compile(softmax_module())
    assert compile(softmax_module()).cache_info["cache"] == "hit"
    assert compile(softmax_module(), opt_level=1).cache_info["cache"] == "miss"
    assert compile(softmax_module(), passes="canonicalize,dce").cache_info["cache"] == "miss"
    assert compile(softmax_module(), name="other").cache_info["cache"] == "miss"
    changed = SCALE.copy()
    changed[3] += 0.25
    other = compile(softmax_module(scale=changed))
    assert other.cache_info["cache"] == "miss"
    np.testing.assert_allclose(other(X), scaled_softmax(X, scale=changed), rtol=1e-5, atol=1e-7)
    host = compile_targets.host_target()
    other_cpu = Target(host.triple, host.cpu, host.features + ",-avx512f")
    monkeypatch.setattr(compile_targets, "host_target", lambda: other_cpu)
    assert compile(softmax_module()).cache_info["cache"] == "miss"
    assert len(builds) == 6


def test_model_file_hit_skips_the_import(tmp_path, monkeypatch, builds):
    from cuvil.ir.printer import export_ir

    monkeypatch.setattr(compile_keys, "STAT_SETTLE_S", -1.0)  # remember the file's digest right away
    path = export_ir(softmax_module(), tmp_path / "model.cir")
    assert compile(path).cache_info["cache"] == "miss"
    imports: list[object] = []
    real_import = compile_job.import_model
    monkeypatch.setattr(compile_job, "import_model", lambda *a, **k: imports.append(a) or real_import(*a, **k))
    hit = compile(path)
    assert hit.cache_info["cache"] == "hit" and imports == []
    np.testing.assert_allclose(hit(X), scaled_softmax(X), rtol=1e-5, atol=1e-7)

    changed = SCALE.copy()
    changed[0] = 0.75
    export_ir(softmax_module(scale=changed), path)  # new content under the same name
    fresh = compile(path)
    assert fresh.cache_info["cache"] == "miss" and len(imports) == 1
    np.testing.assert_allclose(fresh(X), scaled_softmax(X, scale=changed), rtol=1e-5, atol=1e-7)


def test_unreadable_alias_means_import_again(tmp_path, monkeypatch, builds, private_cache):
    from cuvil.ir.printer import export_ir

    path = export_ir(softmax_module(), tmp_path / "model.cir")
    compile(path)
    for alias in (private_cache / "v1" / "aliases").glob("*.json"):
        record = json.loads(alias.read_text())
        if "signature" in record:
            alias.write_text(json.dumps({**record, "signature": {"inputs": "garbage"}}))
    imports: list[object] = []
    real_import = compile_job.import_model
    monkeypatch.setattr(compile_job, "import_model", lambda *a, **k: imports.append(a) or real_import(*a, **k))
    again = compile(path)
    assert len(imports) == 1 and again.cache_info["cache"] == "hit" and len(builds) == 1
    np.testing.assert_allclose(again(X), scaled_softmax(X), rtol=1e-5, atol=1e-7)


def test_staging_left_by_a_dead_build_is_swept(private_cache):
    cache = ArtifactCache(private_cache)
    dead = cache.staging / "deadbeef-left-over"
    dead.mkdir()
    recent = cache.staging / "cafe-in-progress"
    recent.mkdir()
    old = 1_000_000_000
    os.utime(dead, (old, old))
    compile(softmax_module())
    assert not dead.exists() and recent.exists()
