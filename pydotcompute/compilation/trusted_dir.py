"""`PinnedDir`: a directory checked once, then used only through the handle that was checked.

The kernel cache holds code the process will run, so it must read back only what it wrote.
Checking a directory by name and then opening files by name leaves a window: another user
who can rename entries of an ancestor swaps the checked directory for theirs in between. So
a `PinnedDir` checks every ancestor as ssh's ``StrictModes`` does (owned by root or by us,
and not writable by group or others unless sticky, as ``/tmp`` is), opens the directory once
(``O_DIRECTORY | O_NOFOLLOW``), checks what it opened with ``fstat`` (ours, not writable by
others), and from then on reads, writes, lists and removes only relative to that descriptor
(``dir_fd=``). Each file is opened ``O_NOFOLLOW`` and checked with ``fstat`` too: a regular
file, ours, not writable by group or others.

Design notes:
- `PinnedDir.problem` also notices when the path no longer leads to the pinned directory
  (another device and inode, or nothing) or the directory itself was opened up: the cache
  then stops using it rather than going on writing into a directory nobody can find. A
  path with nothing at it is simply checked afresh when next needed (a cache removed by
  hand is made again); one that leads to another directory is never used again.
- Where descriptors relative to a directory are not supported (Windows), the same calls go
  by path, and owners and modes are not checked (they do not apply there).
- A replaced pin's descriptor is closed when the object is collected, not at once: another
  thread may be using it, and a closed number can be reused by the next ``open``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path

__all__ = ("GONE", "PinnedDir", "UntrustedPathError", "ancestor_problem", "make_private_dirs")

#: `PinnedDir.problem` when nothing is at the path any more (removed, or renamed away).
GONE = "is gone"

_AT = (
    hasattr(os, "O_DIRECTORY")
    and hasattr(os, "O_NOFOLLOW")
    and os.open in os.supports_dir_fd
    and os.scandir in os.supports_fd
)
_OWNERS = hasattr(os, "geteuid")  # POSIX owners and modes apply
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_BINARY = getattr(os, "O_BINARY", 0)


class UntrustedPathError(Exception):
    """A directory or file another user could have written or replaced; the message says
    why, as the end of a sentence ("is owned by uid 1001, not by this user ..."), and
    ``ancestor`` is the directory above it to blame, when one is."""

    def __init__(self, why: str, ancestor: str | None = None) -> None:
        super().__init__(why)
        self.ancestor = ancestor


def _problem(st: os.stat_result, *, ancestor: bool = False) -> str | None:
    """Why ``st`` could be written by another user: not owned by us (an ancestor may be
    root's), or writable by group or others (an ancestor may be, when sticky)."""
    uid = os.geteuid()
    if st.st_uid != uid and not (ancestor and st.st_uid == 0):
        whose = f"this user (uid {uid}) or root" if ancestor else f"this user (uid {uid})"
        return f"is owned by uid {st.st_uid}, not by {whose}"
    if st.st_mode & 0o022 and not (ancestor and st.st_mode & stat.S_ISVTX):
        mode = oct(stat.S_IMODE(st.st_mode))
        sticky = " and is not sticky" if ancestor else ""
        return f"can be written by its group or by others (mode {mode}){sticky}"
    return None


def ancestor_problem(real: str) -> tuple[str, str] | None:
    """The first ancestor of ``real`` (an absolute path without links) through which
    another user could rename or replace it, and why; None when there is none."""
    here = os.path.dirname(real)
    while True:
        why = _problem(os.lstat(here), ancestor=True)
        if why is not None:
            return here, why
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


def make_private_dirs(path: Path) -> None:
    """Make ``path`` and its missing parents, each 0700 (``mkdir -p`` would leave the
    parents to the umask, group-writable under a 002 one)."""
    missing = []
    here = path
    while not os.path.lexists(here):
        missing.append(here)
        if here.parent == here:
            break
        here = here.parent
    for made in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(made, 0o700)


class PinnedDir:
    """An existing directory, checked and opened once (see the module notes).

    Args:
        path: The directory (links in it are resolved first, then checked).
        ancestors: Check the ancestors too (False for a directory this process just made
            private, whose descriptor is all that is used).

    Raises:
        UntrustedPathError: another user could write or replace it.
        FileNotFoundError: it does not exist.
    """

    __slots__ = ("fd", "ident", "path", "real")

    def __init__(self, path: Path, *, ancestors: bool = True) -> None:
        self.path = path
        self.real = os.path.realpath(path)
        self.fd: int | None = None
        if _OWNERS and ancestors:
            found = ancestor_problem(self.real)
            if found is not None:
                where, why = found
                raise UntrustedPathError(f"is inside {where}, which {why}", where)
        if _AT:
            try:
                fd = os.open(self.real, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW | _CLOEXEC)
            except NotADirectoryError:
                raise UntrustedPathError("is not a directory") from None
            except OSError as exc:
                if exc.errno == errno.ELOOP:  # (a link put there since it was resolved)
                    raise UntrustedPathError("is a symbolic link") from None
                raise
            try:
                st = os.fstat(fd)
                problem = _problem(st) if _OWNERS else None
                if problem is not None:
                    raise UntrustedPathError(problem)
            except BaseException:
                os.close(fd)
                raise
            self.fd = fd
        else:
            st = os.stat(self.real)
            if not stat.S_ISDIR(st.st_mode):
                raise UntrustedPathError("is not a directory")
        self.ident = (st.st_dev, st.st_ino)

    def __del__(self) -> None:
        fd, self.fd = getattr(self, "fd", None), None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def problem(self) -> str | None:
        """Why this directory is no longer to be used (None: it still is): the path leads
        elsewhere now, or the directory became writable by others (or another's)."""
        try:
            st = os.lstat(self.real)
        except FileNotFoundError:
            return GONE
        if (st.st_dev, st.st_ino) != self.ident:
            return (
                f"now leads to another directory (device {st.st_dev}, inode {st.st_ino}; "
                f"the one checked was device {self.ident[0]}, inode {self.ident[1]})"
            )
        if self.fd is not None and _OWNERS:
            why = _problem(os.fstat(self.fd))
            if why is not None:
                return f"now {why}"
        return None

    def _at(self, name: str) -> str:
        return name if self.fd is not None else os.path.join(self.real, name)

    def read(self, name: str) -> bytes | None:
        """The whole file ``name``, or None when there is none.

        Raises:
            UntrustedPathError: it is a link, not a regular file, not ours, or writable by
                group or others.
        """
        flags = os.O_RDONLY | _NOFOLLOW | _CLOEXEC | _BINARY
        try:
            fd = os.open(self._at(name), flags, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UntrustedPathError("is a symbolic link") from None
            raise
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise UntrustedPathError("is not a regular file")
            why = _problem(st) if _OWNERS else None
            if why is not None:
                raise UntrustedPathError(why)
            return fh.read()

    def write(self, name: str, payload: bytes) -> None:
        """Write ``name`` atomically: a private temporary file, then ``os.replace``."""
        tmp = f".tmp-{secrets.token_hex(8)}{os.path.splitext(name)[1]}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC | _BINARY
        fd = os.open(self._at(tmp), flags, 0o600, dir_fd=self.fd)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(payload)
            os.replace(self._at(tmp), self._at(name), src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(self._at(tmp), dir_fd=self.fd)
            raise

    def unlink(self, name: str) -> bool:
        """Remove ``name``; whether it was there."""
        try:
            os.unlink(self._at(name), dir_fd=self.fd)
        except FileNotFoundError:
            return False
        return True

    def touch(self, name: str) -> None:
        """Set ``name``'s times to now (the cache's recency); errors are ignored."""
        with contextlib.suppress(OSError, NotImplementedError):
            os.utime(self._at(name), dir_fd=self.fd, follow_symlinks=self.fd is None)

    def lstat(self, name: str) -> os.stat_result | None:
        """``name``'s own status (a link is not followed), or None when there is none."""
        try:
            return os.stat(self._at(name), dir_fd=self.fd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def names(self) -> list[str]:
        """The names of the regular files in the directory."""
        target: int | str = self.fd if self.fd is not None else self.real
        with os.scandir(target) as scan:
            return [e.name for e in scan if e.is_file(follow_symlinks=False)]

    def path_of(self, name: str) -> Path:
        """Where ``name`` is, by path (for messages and `CacheEntry.ptx_path`)."""
        return self.path / name
