"""KernelCache: compiled kernels (PTX, cubin) on disk, shared across processes, LRU-bounded.

Layout: one directory; each entry is ``<key>.bin`` (the artifact) plus ``<key>.json`` (kind,
size, name, creation time and free-form metadata). Writes go to a temporary file in the same
directory and are published with ``os.replace``, so a reader in another process sees either
the old entry, the new one or none — never a torn file. Recency is the artifact's mtime,
refreshed on every ``load``; after each ``store`` the least recently used entries are removed
until both ``max_entries`` and ``max_size_mb`` hold. No index file is kept: the directory is
the index, which is what makes concurrent processes safe without a lock file.

Default location: ``$PYDOTCOMPUTE_CACHE_DIR``, else ``$XDG_CACHE_HOME/pydotcompute/kernels``,
else ``~/.cache/pydotcompute/kernels``.

Trust: a cached artifact is code the process will run, so the directory must be one only
this user can write. It is created private (0700); an existing one owned by another user,
or writable by its group or by others, is not used at all: a ``RuntimeWarning`` says why and
the cache moves to a new private directory for the life of the process (removed at exit).
Each entry's record holds the SHA-256 of its artifact and its key; ``load`` returns nothing
for an artifact that does not match its record (a torn, copied or replaced file) or whose
record lacks what the caller expects (``expect=``: the compiler passes the hash of the source
and options it compiles). A record does not stop someone who can write the directory, which
is why the directory itself is checked.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import threading
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

from ..exceptions import InvalidConfigurationError

__all__ = ("CacheEntry", "CacheStats", "KernelCache", "default_cache_dir", "get_kernel_cache")

_KEY_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_DATA = ".bin"
_META = ".json"


def default_cache_dir() -> Path:
    """Where kernels are cached when no directory is given (see the module docstring)."""
    env = os.environ.get("PYDOTCOMPUTE_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pydotcompute" / "kernels"


def _unsafe_dir(path: Path) -> str | None:
    """Why another user could put files in the existing directory ``path`` (None: only we
    can; also None where owners and modes do not apply)."""
    geteuid = getattr(os, "geteuid", None)
    if geteuid is None:
        return None
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != geteuid():
        return f"is owned by uid {st.st_uid}, not by this user (uid {geteuid()})"
    if st.st_mode & 0o022:
        return f"can be written by its group or by others (mode {oct(stat.S_IMODE(st.st_mode))})"
    return None


def _private_dir() -> Path:
    """A new directory only this user can use, removed when this process exits."""
    path = tempfile.mkdtemp(prefix="pydotcompute-kernels-")
    pid = os.getpid()

    def remove() -> None:
        if os.getpid() == pid:  # not in a forked child, which did not make it
            shutil.rmtree(path, ignore_errors=True)

    atexit.register(remove)
    return Path(path)


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One cached artifact.

    `kernel_name` and `source_hash` are those given to `store(kernel_name, source_hash,
    ptx)`; for entries the compiler wrote, `kernel_name` is the kernel's name and
    `source_hash` is empty (its key already covers the source). Every field has a default,
    so PyDotCompute 0.2's keyword form (`kernel_name=`, `source_hash=`, `signature=`,
    `ptx_path=`, `created_timestamp=`, `last_accessed=`, `hit_count=`) builds one too;
    `ptx_path` is the artifact's path and `last_accessed` the same as `last_used`.
    """

    key: str = ""
    kind: str = ""
    size_bytes: int = 0
    last_used: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)
    kernel_name: str = ""
    source_hash: str = ""
    signature: Any = None
    ptx_path: str | None = None
    created_timestamp: float = 0.0
    last_accessed: float = 0.0
    hit_count: int = 0


@dataclass(frozen=True, slots=True)
class CacheStats:
    """Counters of one ``KernelCache`` object plus what its directory holds now."""

    cache_dir: str
    entries: int
    size_bytes: int
    hits: int
    misses: int
    stores: int
    evictions: int
    max_entries: int
    max_size_bytes: int

    # PyDotCompute 0.2's get_stats() returned a dict; these keys read the same values.
    _COMPAT_KEYS = {
        "entries": "entries",
        "max_entries": "max_entries",
        "total_size_bytes": "size_bytes",
        "max_size_bytes": "max_size_bytes",
        "total_hits": "hits",
        "cache_dir": "cache_dir",
    }

    def __getitem__(self, key: str) -> Any:
        """``stats["total_hits"]``: the 0.2 dict keys (see `keys()`)."""
        return getattr(self, self._COMPAT_KEYS[key])

    def keys(self) -> list[str]:
        """The 0.2 dict keys: entries, max_entries, total_size_bytes, max_size_bytes,
        total_hits (this object's hits) and cache_dir."""
        return list(self._COMPAT_KEYS)

    @property
    def hit_rate(self) -> float:
        """Hits over lookups (0.0 before the first lookup)."""
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0


class KernelCache:
    """An on-disk, process-safe, LRU-bounded store of compiled kernels.

    Args:
        cache_dir: the directory (created on first store); default `default_cache_dir`.
        max_entries: keep at most this many entries.
        max_size_mb: keep at most this many MiB of artifacts.

    Raises:
        InvalidConfigurationError: a limit is not positive.
    """

    def __init__(
        self,
        cache_dir: str | os.PathLike[str] | None = None,
        max_entries: int = 128,
        max_size_mb: float = 256,
    ) -> None:
        if not isinstance(max_entries, int) or max_entries < 1:
            raise InvalidConfigurationError(f"max_entries must be an int >= 1, got {max_entries!r}")
        if not max_size_mb or max_size_mb <= 0:
            raise InvalidConfigurationError(f"max_size_mb must be > 0, got {max_size_mb!r}")
        self._dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        self.max_entries = max_entries
        self.max_size_bytes = int(max_size_mb * 2**20)
        self._lock = threading.Lock()
        self._hits = self._misses = self._stores = self._evictions = 0
        self._checked = False  # the directory was found safe (or replaced by a private one)
        self._dir_lock = threading.Lock()

    @property
    def cache_dir(self) -> Path:
        """The directory entries live in (a private one if the given one is not safe)."""
        return self._usable_dir()

    def _usable_dir(self, *, create: bool = False) -> Path:
        """The directory, checked once it exists (see the module notes); ``create`` makes
        it, private, when it does not exist yet."""
        if self._checked:
            return self._dir
        with self._dir_lock:
            if self._checked:
                return self._dir
            path = self._dir
            if create:
                path.parent.mkdir(parents=True, exist_ok=True)
                with contextlib.suppress(FileExistsError):
                    path.mkdir(mode=0o700)
            try:
                problem = _unsafe_dir(path)
            except FileNotFoundError:
                return path  # nothing there to read; checked when it is made
            if problem is not None:
                self._dir = _private_dir()
                warnings.warn(
                    f"kernel cache directory {path} is not used: it {problem}, so another "
                    "user could have put compiled code in it. Kernels are cached in "
                    f"{self._dir} for this process instead. Remove that directory or make "
                    f"it yours and private (chmod 700 {path}), or set PYDOTCOMPUTE_CACHE_DIR "
                    "to a directory of your own",
                    RuntimeWarning,
                    stacklevel=4,
                )
            self._checked = True
            return self._dir

    @staticmethod
    def _check_key(key: str) -> None:
        if not isinstance(key, str) or not _KEY_RE.match(key):
            raise InvalidConfigurationError(
                f"cache keys are 1-128 characters of A-Z a-z 0-9 _ . -, got {key!r}"
            )

    def _paths(self, key: str, *, create: bool = False) -> tuple[Path, Path]:
        self._check_key(key)
        where = self._usable_dir(create=create)
        return where / f"{key}{_DATA}", where / f"{key}{_META}"

    # --- operations ------------------------------------------------------------------------

    @staticmethod
    def entry_key(kernel_name: str, source_hash: str) -> str:
        """The key `store(kernel_name, source_hash, ptx)` files an artifact under."""
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", str(kernel_name))[:64] or "kernel"
        digest = hashlib.sha256(str(source_hash).encode()).hexdigest()[:40]
        return f"{safe}-{digest}"

    @overload
    def store(
        self,
        key: str,
        data: bytes | str,
        *,
        kind: str = ...,
        metadata: dict[str, Any] | None = ...,
    ) -> Path: ...

    @overload
    def store(
        self,
        kernel_name: str,
        source_hash: str,
        ptx: bytes | str,
        /,
        *,
        signature: Any = ...,
        metadata: dict[str, Any] | None = ...,
    ) -> bool: ...

    @overload
    def store(
        self,
        *,
        kernel_name: str,
        source_hash: str,
        ptx: bytes | str,
        signature: Any = ...,
        metadata: dict[str, Any] | None = ...,
    ) -> bool: ...

    def store(
        self,
        key: str | None = None,
        data: bytes | str | None = None,
        ptx: bytes | str | None = None,
        *,
        kind: str = "ptx",
        signature: Any = None,
        metadata: dict[str, Any] | None = None,
        kernel_name: str | None = None,
        source_hash: str | None = None,
    ) -> Path | bool:
        """Write an artifact atomically, then evict down to the limits.

        Two forms:

        - `store(key, data)` files `data` under `key` and returns its path; a write
          failure raises `OSError`.
        - `store(kernel_name, source_hash, ptx, signature=None)` (the form older code
          uses) files `ptx` under `entry_key(kernel_name, source_hash)` and returns whether
          it was written: a write failure returns False.

        Raises:
            InvalidConfigurationError: a malformed key.
            OSError: the directory cannot be written (the two-argument form).
        """
        key = key if kernel_name is None else kernel_name
        data = data if source_hash is None else source_hash
        if key is None or data is None:
            raise TypeError(
                "store() needs (key, data) or (kernel_name, source_hash, ptx), "
                f"got key={key!r}, data={'...' if data is not None else None}"
            )
        if ptx is None:
            return self._store(key, data, kind=kind, metadata=metadata)
        named = {
            "kernel_name": key,
            "source_hash": str(data),
            "signature": None if signature is None else str(signature),
        }
        try:
            self._store(
                self.entry_key(key, str(data)),
                ptx,
                kind=kind,
                metadata=metadata,
                extra=named,
            )
        except OSError:
            return False
        return True

    def _store(
        self,
        key: str,
        data: bytes | str,
        *,
        kind: str,
        metadata: dict[str, Any] | None,
        extra: dict[str, Any] | None = None,
    ) -> Path:
        data_path, meta_path = self._paths(key, create=True)
        payload = data.encode() if isinstance(data, str) else bytes(data)
        meta = {
            "key": key,
            "kind": kind,
            "size": len(payload),
            "sha256": hashlib.sha256(payload).hexdigest(),
            "created": time.time(),
            "metadata": metadata or {},
            **(extra or {}),
        }
        self._atomic_write(meta_path, json.dumps(meta, sort_keys=True).encode())
        self._atomic_write(data_path, payload)
        with self._lock:
            self._stores += 1
        self._evict(keep=key)
        return data_path

    def _atomic_write(self, path: Path, payload: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(payload)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def _resolve(self, key: str | None, source_hash: str | None, kernel_name: str | None) -> str:
        name = kernel_name if kernel_name is not None else key
        if name is None:
            raise TypeError("give a key, or kernel_name and source_hash")
        return name if source_hash is None else self.entry_key(name, source_hash)

    def load(
        self,
        key: str | None = None,
        source_hash: str | None = None,
        *,
        kernel_name: str | None = None,
        expect: Mapping[str, Any] | None = None,
    ) -> bytes | None:
        """The artifact under `key` (or stored as `(kernel_name, source_hash)`), or `None`;
        a hit refreshes its recency.

        The artifact is returned only when it matches its record (its SHA-256 and key, and
        the `source_hash` of the second form) and the record's metadata holds every item of
        `expect`; anything else is a miss (see the module notes).
        """
        name = self._resolve(key, source_hash, kernel_name)
        data_path, _ = self._paths(name)
        try:
            payload = data_path.read_bytes()
        except OSError:
            payload = None
        if payload is not None:
            meta = self.metadata(name) or {}
            user_meta = meta.get("metadata")
            if (
                meta.get("key") != name
                or meta.get("sha256") != hashlib.sha256(payload).hexdigest()
                or (source_hash is not None and meta.get("source_hash") != str(source_hash))
                or not isinstance(user_meta, dict)
                or any(user_meta.get(k) != v for k, v in (expect or {}).items())
            ):
                payload = None
        if payload is None:
            with self._lock:
                self._misses += 1
            return None
        with contextlib.suppress(OSError):
            os.utime(data_path)
        with self._lock:
            self._hits += 1
        return payload

    def load_text(self, key: str, *, expect: Mapping[str, Any] | None = None) -> str | None:
        """``load`` decoded as UTF-8 (PTX is text); None for bytes that are not UTF-8."""
        payload = self.load(key, expect=expect)
        if payload is None:
            return None
        try:
            return payload.decode()
        except UnicodeDecodeError:
            return None

    def contains(
        self,
        key: str | None = None,
        source_hash: str | None = None,
        *,
        kernel_name: str | None = None,
    ) -> bool:
        """Whether `key` (or `(kernel_name, source_hash)`) is cached (does not count as a
        hit or refresh recency)."""
        data_path, _ = self._paths(self._resolve(key, source_hash, kernel_name))
        return data_path.is_file()

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.contains(key)

    def metadata(self, key: str) -> dict[str, Any] | None:
        """The JSON metadata stored with ``key``, or ``None``."""
        _, meta_path = self._paths(key)
        try:
            return json.loads(meta_path.read_text())  # type: ignore[no-any-return]
        except (OSError, ValueError):
            return None

    def remove(
        self,
        key: str | None = None,
        source_hash: str | None = None,
        *,
        kernel_name: str | None = None,
    ) -> bool:
        """Delete `key` (or `(kernel_name, source_hash)`); returns whether it existed."""
        data_path, meta_path = self._paths(self._resolve(key, source_hash, kernel_name))
        existed = data_path.is_file()
        for path in (data_path, meta_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        return existed

    def clear(self) -> int:
        """Delete every entry; returns how many there were."""
        entries = self.entries()
        for entry in entries:
            self.remove(entry.key)
        return len(entries)

    def entries(self) -> list[CacheEntry]:
        """Every entry, least recently used first."""
        where = self._usable_dir()
        if not where.is_dir():
            return []
        found = []
        for data_path in where.glob(f"*{_DATA}"):
            key = data_path.name[: -len(_DATA)]
            if not _KEY_RE.match(key):
                continue
            try:
                st = data_path.stat()
            except OSError:
                continue
            meta = self.metadata(key) or {}
            user_meta = dict(meta.get("metadata", {}))
            found.append(
                CacheEntry(
                    key=key,
                    kind=str(meta.get("kind", "unknown")),
                    size_bytes=st.st_size,
                    last_used=st.st_mtime,
                    metadata=user_meta,
                    kernel_name=str(meta.get("kernel_name") or user_meta.get("name") or ""),
                    source_hash=str(meta.get("source_hash") or ""),
                    ptx_path=str(data_path),
                    created_timestamp=float(meta.get("created") or 0.0),
                    last_accessed=st.st_mtime,
                )
            )
        found.sort(key=lambda e: (e.last_used, e.key))
        return found

    def _evict(self, *, keep: str) -> None:
        entries = self.entries()
        total = sum(e.size_bytes for e in entries)
        count = len(entries)
        for entry in entries:
            if count <= self.max_entries and total <= self.max_size_bytes:
                break
            if entry.key == keep:
                continue
            if self.remove(entry.key):
                with self._lock:
                    self._evictions += 1
            count -= 1
            total -= entry.size_bytes

    def get_stats(self) -> CacheStats:
        """Counters of this object and the directory's current contents."""
        entries = self.entries()
        where = self._usable_dir()
        with self._lock:
            return CacheStats(
                cache_dir=str(where),
                entries=len(entries),
                size_bytes=sum(e.size_bytes for e in entries),
                hits=self._hits,
                misses=self._misses,
                stores=self._stores,
                evictions=self._evictions,
                max_entries=self.max_entries,
                max_size_bytes=self.max_size_bytes,
            )

    def __repr__(self) -> str:
        stats = self.get_stats()
        return (
            f"KernelCache(entries={stats.entries}/{self.max_entries}, "
            f"size={stats.size_bytes / 1024:.1f}KB, dir={str(self._dir)!r})"
        )


_cache: KernelCache | None = None
_cache_lock = threading.Lock()


def get_kernel_cache() -> KernelCache:
    """The process-wide ``KernelCache`` in `default_cache_dir`."""
    global _cache
    with _cache_lock:
        if _cache is None:
            _cache = KernelCache()
        return _cache
