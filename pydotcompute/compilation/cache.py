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
this user can write or replace. It is created private (0700, missing parents too); an
existing one owned by another user, or writable by its group or by others, or inside a
directory through which another user could rename it (each ancestor must be root's or ours,
and not writable by group or others unless sticky, as ``/tmp`` is), is not used at all: a
``RuntimeWarning`` says why and the cache moves to a new private directory for the life of
the process (removed at exit). The directory is checked once and opened once: every read,
write and listing goes through that handle (`trusted_dir.PinnedDir`), so a directory put
at the path later is never read; when the path stops leading to the one checked, or it is
opened up to others, the cache warns and moves to a private directory as above. Each file
is opened without following links and used only when it is a regular file of ours that
others cannot write (else a ``RuntimeWarning`` and a miss). Each entry's record holds the
SHA-256 of its artifact and its key; ``load`` returns nothing for an artifact that does not
match its record (a torn, copied or replaced file) or whose record lacks what the caller
expects (``expect=``: the compiler passes the hash of the source and options it compiles). A
record does not stop someone who can write the directory, which is why the directory itself
is checked.
"""

from __future__ import annotations

import atexit
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
from .trusted_dir import GONE, PinnedDir, UntrustedPathError, make_private_dirs

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
        self._pin: PinnedDir | None = None  # the directory checked, and opened (see notes)
        self._dir_lock = threading.Lock()

    @property
    def cache_dir(self) -> Path:
        """The directory entries live in (a private one if the given one is not safe)."""
        pin = self._where()
        return self._dir if pin is None else pin.path

    def _where(self, *, create: bool = False) -> PinnedDir | None:
        """The directory, checked and opened on first use (see the module notes) and
        checked again on each use; None while it does not exist (``create`` makes it,
        private)."""
        pin = self._pin
        if pin is not None and pin.problem() is None:
            return pin
        with self._dir_lock:
            pin = self._pin
            problem = None if pin is None else pin.problem()
            if pin is not None and problem is None:
                return pin
            if pin is not None and problem != GONE:
                self._distrust(
                    pin.path,
                    f"is no longer used: since it was checked, it {problem}, so what is there "
                    "now need not be what this process wrote",
                    "Find out what changed it, and keep the cache where only this user can "
                    "write or rename it",
                )
                return self._pin
            self._pin = None  # (removed: checked afresh, as on first use)
            path = self._dir
            if create:
                make_private_dirs(path)
            try:
                self._pin = PinnedDir(path)
            except FileNotFoundError:
                return None  # nothing there to read; checked when it is made
            except UntrustedPathError as exc:
                above = exc.ancestor
                fix = (
                    f"Remove that directory or make it yours and private (chmod 700 {path})"
                    if above is None
                    else f"Let only its owner write {above} (chmod go-w {above}, or chmod +t "
                    "for a shared one like /tmp)"
                )
                self._distrust(
                    path,
                    f"is not used: it {exc}, so another user could have put compiled code in "
                    "it or swapped it",
                    fix,
                )
            return self._pin

    def _distrust(self, path: Path, what: str, fix: str) -> None:
        """Move to a new private directory for the life of the process, saying why."""
        self._dir = _private_dir()
        self._pin = PinnedDir(self._dir, ancestors=False)  # made private, opened: ours
        warnings.warn(
            f"kernel cache directory {path} {what}. Kernels are cached in {self._dir} for "
            f"this process instead. {fix}, or set PYDOTCOMPUTE_CACHE_DIR to a directory of "
            "your own",
            RuntimeWarning,
            stacklevel=4,
        )

    def _read(self, pin: PinnedDir, name: str) -> bytes | None:
        """File ``name`` of ``pin``; None when missing, unreadable, or not to be trusted
        (a link, another's, writable by others: said in a ``RuntimeWarning``)."""
        try:
            return pin.read(name)
        except UntrustedPathError as exc:
            warnings.warn(
                f"kernel cache entry {pin.path_of(name)} is not used: it {exc}, so another "
                "user could have written it. Remove it (the cache writes its files 0600)",
                RuntimeWarning,
                stacklevel=4,
            )
        except OSError:
            pass
        return None

    @staticmethod
    def _check_key(key: str) -> None:
        if not isinstance(key, str) or not _KEY_RE.match(key):
            raise InvalidConfigurationError(
                f"cache keys are 1-128 characters of A-Z a-z 0-9 _ . -, got {key!r}"
            )

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
        self._check_key(key)
        pin = self._where(create=True)
        if pin is None:
            raise FileNotFoundError(f"kernel cache directory {self._dir} could not be made")
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
        pin.write(key + _META, json.dumps(meta, sort_keys=True).encode())
        pin.write(key + _DATA, payload)
        with self._lock:
            self._stores += 1
        self._evict(keep=key)
        return pin.path_of(key + _DATA)

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
        self._check_key(name)
        pin = self._where()
        payload = None if pin is None else self._read(pin, name + _DATA)
        if (
            pin is None
            or payload is None
            or not self._matches(pin, name, payload, source_hash, expect)
        ):
            with self._lock:
                self._misses += 1
            return None
        pin.touch(name + _DATA)
        with self._lock:
            self._hits += 1
        return payload

    def _matches(
        self,
        pin: PinnedDir,
        name: str,
        payload: bytes,
        source_hash: str | None,
        expect: Mapping[str, Any] | None,
    ) -> bool:
        """Whether ``payload`` is what the record of ``name`` describes (see `load`)."""
        meta = self._record(pin, name) or {}
        user_meta = meta.get("metadata")
        return not (
            meta.get("key") != name
            or meta.get("sha256") != hashlib.sha256(payload).hexdigest()
            or (source_hash is not None and meta.get("source_hash") != str(source_hash))
            or not isinstance(user_meta, dict)
            or any(user_meta.get(k) != v for k, v in (expect or {}).items())
        )

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
        name = self._resolve(key, source_hash, kernel_name)
        self._check_key(name)
        pin = self._where()
        st = None if pin is None else pin.lstat(name + _DATA)
        return st is not None and stat.S_ISREG(st.st_mode)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.contains(key)

    def metadata(self, key: str) -> dict[str, Any] | None:
        """The JSON metadata stored with ``key``, or ``None``."""
        self._check_key(key)
        pin = self._where()
        return None if pin is None else self._record(pin, key)

    def _record(self, pin: PinnedDir, key: str) -> dict[str, Any] | None:
        data = self._read(pin, key + _META)
        if data is None:
            return None
        try:
            record = json.loads(data)
        except ValueError:
            return None
        return record if isinstance(record, dict) else None

    def remove(
        self,
        key: str | None = None,
        source_hash: str | None = None,
        *,
        kernel_name: str | None = None,
    ) -> bool:
        """Delete `key` (or `(kernel_name, source_hash)`); returns whether it existed."""
        name = self._resolve(key, source_hash, kernel_name)
        self._check_key(name)
        pin = self._where()
        if pin is None:
            return False
        existed = pin.unlink(name + _DATA)
        pin.unlink(name + _META)
        return existed

    def clear(self) -> int:
        """Delete every entry; returns how many there were."""
        entries = self.entries()
        for entry in entries:
            self.remove(entry.key)
        return len(entries)

    def entries(self) -> list[CacheEntry]:
        """Every entry, least recently used first."""
        pin = self._where()
        if pin is None:
            return []
        found = []
        for name in pin.names():
            key = name[: -len(_DATA)]
            if not name.endswith(_DATA) or not _KEY_RE.match(key):
                continue
            st = pin.lstat(name)
            if st is None:
                continue
            meta = self._record(pin, key) or {}
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
                    ptx_path=str(pin.path_of(name)),
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
        where = self.cache_dir
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
