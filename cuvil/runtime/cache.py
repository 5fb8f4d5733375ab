"""The compiled-artifact cache: one directory of files per (model, options, toolchain, CPU) key.

A library that is loaded runs native code in the calling process, so the cache only ever
loads from a directory this user owns and nobody else can write, checks the library's
SHA-256 before ``dlopen``, and publishes entries atomically (a finished build is renamed
into place; readers never see half an entry). Processes compiling the same key take an
``flock`` on it: the first builds, the others wait and then load what it built.

Layout under the root (``$CUVIL_CACHE_DIR``, else ``$XDG_CACHE_HOME/cuvil`` or ``~/.cache/cuvil``)::

    v1/entries/<key>/entry.json          the record: build folder, file names, library hash, key material
    v1/entries/<key>/build-<id>/         lib<prefix>.so, <prefix>.h, <prefix>.json (the manifest)
    v1/aliases/<key>.json   source file digest -> module hash and signature (skips the import)
    v1/locks/<key>.lock     build locks
    v1/tmp/                 staging folders of builds in progress
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuvil.codegen.manifest import MANIFEST_FORMAT, file_sha256
from cuvil.errors import CuvilError

logger = logging.getLogger("cuvil")

LAYOUT_VERSION = 1
ENTRY_RECORD = "entry.json"
PRIVATE_MODE = 0o700
STALE_STAGING_S = 24 * 3600.0


class CacheError(CuvilError):
    """The artifact cache cannot be used (a directory cannot be created or read)."""

    code = "CUVIL-CACHE"
    default_hint = "set $CUVIL_CACHE_DIR to a private directory, or compile with cache=False / --no-cache"


class UnsafeCacheError(CacheError):
    """The cache directory could be modified by another user: loading from it could run their code."""

    code = "CUVIL-CACHE-UNSAFE"


def default_cache_dir() -> Path:
    """``$CUVIL_CACHE_DIR``, else the user's cache directory (``$XDG_CACHE_HOME`` or ``~/.cache``) + ``/cuvil``."""
    explicit = os.environ.get("CUVIL_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "cuvil"


def check_private_dir(path: Path) -> None:
    """Refuse a directory that is not a directory, belongs to another user, or others can write."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise CacheError(f"cannot read the cache directory {path}: {e.strerror}", location=str(path)) from None
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeCacheError(f"the cache path {path} is not a directory", location=str(path),
                               hint="remove it, or point $CUVIL_CACHE_DIR elsewhere")
    if st.st_uid != os.geteuid():
        raise UnsafeCacheError(f"the cache directory {path} is owned by uid {st.st_uid}, not by this user "
                               f"(uid {os.geteuid()})", location=str(path),
                               hint="use a directory you own: set $CUVIL_CACHE_DIR, or compile with cache=False")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeCacheError(f"the cache directory {path} is writable by other users "
                               f"(mode {stat.S_IMODE(st.st_mode):04o})", location=str(path),
                               hint=f"run `chmod 700 {path}`, or point $CUVIL_CACHE_DIR at a private directory")


def _private_dir(path: Path) -> Path:
    """Create ``path`` (mode 0700; missing parents with the default mode) and check it is private."""
    if not path.exists():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.mkdir(mode=PRIVATE_MODE)
            os.chmod(path, PRIVATE_MODE)  # mkdir's mode is filtered by the umask
        except FileExistsError:
            pass  # another process created it first; it is checked below like any existing one
        except OSError as e:
            raise CacheError(f"cannot create the cache directory {path}: {e.strerror}", location=str(path)) from None
    check_private_dir(path)
    return path


def _write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    staged = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(dict(data), f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(staged, path)


def key_of(material: Mapping[str, Any]) -> str:
    """The content address of a compile: SHA-256 of its canonical JSON description."""
    text = json.dumps(dict(material), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Entry:
    """A published, verified cache entry."""

    key: str
    directory: Path
    library_path: Path
    manifest: dict[str, Any]


class ArtifactCache:
    """One cache root. Creating it creates and checks the directories (``UnsafeCacheError`` if unsafe)."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = _private_dir(Path(root).expanduser() if root is not None else default_cache_dir())
        self.base = _private_dir(self.root / f"v{LAYOUT_VERSION}")
        self.entries = _private_dir(self.base / "entries")
        self.aliases = _private_dir(self.base / "aliases")
        self.locks = _private_dir(self.base / "locks")
        self.staging = _private_dir(self.base / "tmp")

    def __repr__(self) -> str:
        return f"<ArtifactCache {self.root}>"

    # -- entries --------------------------------------------------------------------------
    def entry_dir(self, key: str) -> Path:
        return self.entries / key

    def lookup(self, key: str) -> Entry | None:
        """The entry for ``key`` if it is complete and its library matches its recorded hash.

        A damaged or tampered entry is removed (and reported) so that the caller rebuilds it;
        its library is never loaded."""
        d = self.entry_dir(key)
        try:
            record = json.loads((d / ENTRY_RECORD).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            self._discard(key, "its entry record is unreadable")
            return None
        problem = self._check_entry(key, d, record)
        if isinstance(problem, str):
            self._discard(key, problem)
            return None
        lib, manifest = problem
        return Entry(key, lib.parent, lib, manifest)

    def _check_entry(self, key: str, d: Path, record: Any) -> str | tuple[Path, dict[str, Any]]:
        if not isinstance(record, dict) or record.get("key") != key:
            return "its entry record does not name this key"
        build, lib_name, man_name = record.get("build"), record.get("library"), record.get("manifest")
        names = (build, lib_name, man_name)
        if not all(isinstance(n, str) and n and "/" not in n and n not in (".", "..") for n in names):
            return "its entry record is malformed"
        d = d / str(build)
        try:
            manifest = json.loads((d / str(man_name)).read_text())
        except (OSError, ValueError):
            return "its manifest is missing or unreadable"
        if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT \
                or manifest.get("library") != lib_name:
            return "its manifest does not describe its library"
        lib = d / str(lib_name)
        try:
            st = os.lstat(lib)
        except OSError:
            return "its library is missing"
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() \
                or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return "its library is not a private regular file"
        digest = file_sha256(lib)
        if digest != record.get("library_sha256") or digest != manifest.get("library_sha256"):
            return "its library does not match the recorded SHA-256 (modified after it was built)"
        return lib, manifest

    def _discard(self, key: str, reason: str) -> None:
        logger.warning("cache entry %s is unusable: %s; removing it and rebuilding", key[:16], reason)
        self.remove(key)

    def remove(self, key: str) -> None:
        """Delete an entry (renamed aside first, so a concurrent reader sees it whole or not at all)."""
        d = self.entry_dir(key)
        trash = self.staging / f"removed-{key[:16]}-{uuid.uuid4().hex}"
        try:
            os.rename(d, trash)
        except FileNotFoundError:
            return
        shutil.rmtree(trash, ignore_errors=True)

    def new_build_dir(self, key: str) -> Path:
        """A fresh folder to build into, inside a private staging folder; :meth:`publish` moves
        the staging folder into place. Every build gets a folder name of its own, so a rebuilt
        library never has the path of one this process may have mapped before."""
        staging = Path(tempfile.mkdtemp(prefix=f"{key[:16]}-", dir=self.staging))
        return staging / f"build-{uuid.uuid4().hex[:12]}"

    def publish(self, key: str, library_path: Path, manifest_path: Path, material: Mapping[str, Any]) -> Entry:
        """Record the build (made in a folder from :meth:`new_build_dir`) and rename its staging
        folder to the entry for ``key`` (atomic)."""
        build = library_path.parent
        staging = build.parent
        if staging.parent != self.staging or manifest_path.parent != build:
            raise CacheError(f"{library_path} was not built in a staging folder of this cache",
                             location=str(library_path))
        manifest = json.loads(manifest_path.read_text())
        record = {"key": key, "build": build.name, "library": library_path.name, "manifest": manifest_path.name,
                  "library_sha256": file_sha256(library_path), "created": time.time(), "material": dict(material)}
        if record["library_sha256"] != manifest.get("library_sha256"):
            raise CacheError(f"the library built for {key[:16]} changed before it was cached",
                             location=str(library_path), hint="another process is writing into the cache")
        _write_json_atomic(staging / ENTRY_RECORD, record)
        self._sweep_staging()
        target = self.entry_dir(key)
        self.remove(key)  # callers hold the key's lock: anything here is stale
        try:
            os.rename(staging, target)
        except OSError as e:
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise CacheError(f"cannot publish cache entry {key[:16]}: {e.strerror}", location=str(target)) from None
            shutil.rmtree(staging, ignore_errors=True)  # another writer got there first; use theirs
            found = self.lookup(key)
            if found is None:
                raise CacheError(f"cache entry {key[:16]} vanished while publishing", location=str(target)) from None
            return found
        return Entry(key, target / build.name, target / build.name / library_path.name, manifest)

    def _sweep_staging(self) -> None:
        """Remove staging folders left by builds that died (older than :data:`STALE_STAGING_S`)."""
        cutoff = time.time() - STALE_STAGING_S
        for p in self.staging.iterdir():
            with contextlib.suppress(OSError):
                if p.stat().st_mtime < cutoff:
                    shutil.rmtree(p, ignore_errors=True)

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[float]:
        """Hold the build lock of ``key``; yields how long it waited for another process (seconds)."""
        path = self.locks / f"{key}.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise CacheError(f"cannot open the lock file {path}: {e.strerror}", location=str(path)) from None
        waited = 0.0
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                logger.debug("cache: another process is building %s; waiting for it", key[:16])
                start = time.perf_counter()
                fcntl.flock(fd, fcntl.LOCK_EX)
                waited = time.perf_counter() - start
            yield waited
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    # -- aliases: source digests -> module hashes --------------------------------------------
    def read_alias(self, key: str) -> dict[str, Any] | None:
        path = self.aliases / f"{key}.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and data.get("key") == key else None

    def write_alias(self, key: str, record: Mapping[str, Any]) -> None:
        try:
            _write_json_atomic(self.aliases / f"{key}.json", {**record, "key": key})
        except OSError as e:  # an alias only saves time; failing to write one is not an error
            logger.debug("cache: could not write alias %s: %s", key[:16], e)

    # -- maintenance ------------------------------------------------------------------------
    def keys(self) -> list[str]:
        return sorted(p.name for p in self.entries.iterdir() if p.is_dir())

    def clear(self) -> None:
        """Remove every entry and alias (locks and the directories themselves stay)."""
        for key in self.keys():
            self.remove(key)
        for p in self.aliases.glob("*.json"):
            p.unlink(missing_ok=True)
