"""A content-keyed store of block results: plain .npz files, verified on every read.

Keys are SHA-256 digests of everything a result depends on (for evaluation blocks the
content of the rows as the run read them, the parameters, the kernel version), so an
entry can never be stale. Each file carries a digest of its key and its arrays (a
checksum against damage, not a signature: anyone who can write the cache can compute
it); a file that is unreadable or fails the check (truncated, altered, or another key's
entry under this name) is treated as missing (and recomputed), never trusted. Nothing
is unpickled. Only regular files are read: an entry's path holding a symbolic link, a
FIFO, a device or a directory is a miss, opened without following links or blocking (a
FIFO there cannot hang the run), and the entry a run then stores is renamed over it.

Entries are written to a hidden temporary file and renamed into place, so runs
sharing a cache (each writing the same keys) never see half an entry. A write
that fails (a full disk, no permission) removes its temporary file and stops
the run with one line naming the cache (an InputError, exit status 2).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import stat
import uuid
from pathlib import Path

import numpy as np

from hashdist.defaults import default_cache_dir
from hashdist.errors import InputError, write_failed


def _digest(key: str, arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256(f"{key}\n".encode())  # bound to its key: an entry under another key's name is not trusted
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _read_regular_file(path: Path, max_bytes: int | None) -> bytes | None:
    """The bytes of the regular file at ``path``, or None when there is none, or something else is there (a
    symbolic link, which is not followed; a FIFO, device, socket or directory), or it holds more than
    ``max_bytes``. Opening does not block (O_NONBLOCK: a FIFO opens at once and is then seen for what it is)
    and a regular file's read does not wait on anyone, so a planted FIFO cannot hang the run past its signals."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError:  # missing, a symbolic link (ELOOP), no permission
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (max_bytes is not None and info.st_size > max_bytes):
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read() if max_bytes is None else f.read(max_bytes + 1)
    except OSError:
        return None
    finally:
        os.close(fd)


class BlockCache:
    """Directory of verified .npz results; ``None`` as the directory disables caching."""

    def __init__(self, directory: str | os.PathLike | None):
        self.directory = Path(directory) if directory is not None else None

    @property
    def argument(self) -> str | bool:
        """This cache as a task's argument: its absolute directory (resolved here, so every worker uses the same
        one, whatever its working directory) or False for none; :func:`resolve_cache` of it gives this cache back."""
        return False if self.directory is None else str(self.directory.absolute())

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.npz"

    def get(self, key: str, max_bytes: int | None = None) -> dict[str, np.ndarray] | None:
        """The verified arrays stored under ``key``, or None (a miss): also for an entry that is not a regular
        file or is larger than ``max_bytes``."""
        if self.directory is None:
            return None
        data = _read_regular_file(self._path(key), max_bytes)
        if data is None:
            return None
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as f:
                arrays = {k: f[k] for k in f.files}
        except Exception:  # truncated or not an npz: a miss
            return None
        stored = arrays.pop("__digest__", None)
        if stored is None or str(stored) != _digest(key, arrays):
            return None
        return arrays

    def put(self, key: str, arrays: dict[str, np.ndarray]) -> None:
        if self.directory is None:
            return
        path = self._path(key)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                np.savez(f, __digest__=np.array(_digest(key, arrays)), **arrays)
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            if isinstance(exc, IsADirectoryError):  # planted at an entry's path: nothing can be renamed over it
                raise InputError(f"cache {self.directory}: {path} is a directory, not a cache entry; remove it, or "
                                 "run with --no-cache") from exc
            raise write_failed(exc, f"cache {self.directory}", "while storing a block result",
                               "its complete entries stay valid (free space, or run with --no-cache)") from exc


def resolve_cache(cache) -> BlockCache:
    """``None`` or ``True``: the per-user default cache; ``False``: no caching; else a directory (str or path)."""
    if cache is False:
        return BlockCache(None)
    if cache is None or cache is True:
        named = "$HASHDIST_CACHE" if os.environ.get("HASHDIST_CACHE") else "the per-user cache"
        return BlockCache(_directory(default_cache_dir(), named))
    if not isinstance(cache, str | os.PathLike):
        raise InputError(f"cache must be None or True (the per-user cache), False (none) or a directory, "
                         f"got {type(cache).__name__} {cache!r}")
    return BlockCache(_directory(cache, "--cache"))


def _directory(path, named: str):
    """``path``, unless it (or the nearest part of it that exists) is not a directory: an InputError naming it."""
    existing = next(p for p in (Path(path).absolute(), *Path(path).absolute().parents) if p.exists())
    if not existing.is_dir():
        raise InputError(f"{named} {path}: {existing} is not a directory")
    return path
