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
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One cached artifact."""

    key: str
    kind: str
    size_bytes: int
    last_used: float
    metadata: dict[str, Any] = field(default_factory=dict)


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

    @property
    def hit_rate(self) -> float:
        """Hits over lookups (0.0 before the first lookup)."""
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0


class KernelCache:
    """An on-disk, process-safe, LRU-bounded store of compiled kernels.

    Args:
        cache_dir: the directory (created on first store); default :func:`default_cache_dir`.
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

    @property
    def cache_dir(self) -> Path:
        """The directory entries live in."""
        return self._dir

    @staticmethod
    def _check_key(key: str) -> None:
        if not isinstance(key, str) or not _KEY_RE.match(key):
            raise InvalidConfigurationError(
                f"cache keys are 1-128 characters of A-Z a-z 0-9 _ . -, got {key!r}"
            )

    def _paths(self, key: str) -> tuple[Path, Path]:
        self._check_key(key)
        return self._dir / f"{key}{_DATA}", self._dir / f"{key}{_META}"

    # --- operations ------------------------------------------------------------------------

    def store(
        self,
        key: str,
        data: bytes | str,
        *,
        kind: str = "ptx",
        metadata: dict[str, Any] | None = None,
    ) -> Path:
        """Write ``data`` under ``key`` atomically, then evict down to the limits.

        Returns:
            The path of the artifact.

        Raises:
            InvalidConfigurationError: a malformed key.
            OSError: the directory cannot be written.
        """
        data_path, meta_path = self._paths(key)
        payload = data.encode() if isinstance(data, str) else bytes(data)
        meta = {
            "key": key,
            "kind": kind,
            "size": len(payload),
            "created": time.time(),
            "metadata": metadata or {},
        }
        self._dir.mkdir(parents=True, exist_ok=True)
        self._atomic_write(meta_path, json.dumps(meta, sort_keys=True).encode())
        self._atomic_write(data_path, payload)
        with self._lock:
            self._stores += 1
        self._evict(keep=key)
        return data_path

    def _atomic_write(self, path: Path, payload: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=self._dir, prefix=".tmp-", suffix=path.suffix)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(payload)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def load(self, key: str) -> bytes | None:
        """The artifact under ``key``, or ``None``; a hit refreshes its recency."""
        data_path, _ = self._paths(key)
        try:
            payload = data_path.read_bytes()
        except OSError:
            with self._lock:
                self._misses += 1
            return None
        with contextlib.suppress(OSError):
            os.utime(data_path)
        with self._lock:
            self._hits += 1
        return payload

    def load_text(self, key: str) -> str | None:
        """``load`` decoded as UTF-8 (PTX is text)."""
        payload = self.load(key)
        return None if payload is None else payload.decode()

    def contains(self, key: str) -> bool:
        """Whether ``key`` is cached (does not count as a hit or refresh recency)."""
        data_path, _ = self._paths(key)
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

    def remove(self, key: str) -> bool:
        """Delete ``key``; returns whether it existed."""
        data_path, meta_path = self._paths(key)
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
        if not self._dir.is_dir():
            return []
        found = []
        for data_path in self._dir.glob(f"*{_DATA}"):
            key = data_path.name[: -len(_DATA)]
            if not _KEY_RE.match(key):
                continue
            try:
                st = data_path.stat()
            except OSError:
                continue
            meta = self.metadata(key) or {}
            found.append(
                CacheEntry(
                    key=key,
                    kind=str(meta.get("kind", "unknown")),
                    size_bytes=st.st_size,
                    last_used=st.st_mtime,
                    metadata=dict(meta.get("metadata", {})),
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
        with self._lock:
            return CacheStats(
                cache_dir=str(self._dir),
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
        return f"<KernelCache {str(self._dir)!r} max_entries={self.max_entries}>"


_cache: KernelCache | None = None
_cache_lock = threading.Lock()


def get_kernel_cache() -> KernelCache:
    """The process-wide ``KernelCache`` in :func:`default_cache_dir`."""
    global _cache
    with _cache_lock:
        if _cache is None:
            _cache = KernelCache()
        return _cache
