"""Output directories: staged writes (readers see the old complete version or the new one) and locks.

Every writer of an output directory uses :func:`staged_directory`: it holds the
output's advisory lock, builds the new version in a hidden temporary sibling and
renames it into place only when the body finished, so an interrupted or failed
write leaves the previous complete output (or none), and two runs never write the
same output at once. :func:`check_output` decides, before any work, whether an output
may be written: hashdist replaces only what it wrote (docs/errors.md, "Overwriting").
"""

import contextlib
import errno
import fcntl
import json
import os
import shutil
import stat
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

from hashdist.errors import NO_ROOM, InputError, write_failed

MARKER_MAX_BYTES = 1 << 26  # a format marker is read from at most this much JSON
_held: set[Path] = set()  # lock files this process holds (a nested writer of the same output reuses the lock)
_held_guard = threading.Lock()


def local_input(source) -> Path | None:
    """The real path of an input given as a path or a ``file://`` URL (None for another URL or no path)."""
    if source is None or not isinstance(source, str | os.PathLike):
        return None
    text = os.fspath(source)
    if "://" in text and not text.startswith("file://"):
        return None
    return Path(text.removeprefix("file://")).resolve()


def check_apart(out, inputs, option: str = "--out", kept=()) -> None:
    """Refuse an output that is one of the run's input paths, lies inside one or holds one: writing it (and
    replacing it) would destroy what the run reads. Inputs are paths or ``file://`` URLs, compared by their real
    paths (links resolved); those that are None, other URLs, or not on disk (as ``<arrays>``) are skipped.
    ``kept``: (what, path) pairs checked the same way whether or not they exist yet (the block cache)."""
    target = Path(out).resolve()
    named = [("the input", source, path) for source in inputs if (path := local_input(source)) and path.exists()]
    named += [(what, source, Path(source).resolve()) for what, source in kept if source is not None]
    for what, source, path in named:
        if target == path or target in path.parents or path in target.parents:
            how = "is" if target == path else "holds" if target in path.parents else "lies inside"
            raise InputError(f"{option} {out}: {how} {what} {source}; write the output elsewhere")


def read_head(file: Path, size: int) -> bytes | None:
    """The first ``size`` bytes of the regular file ``file`` (not followed through a link, opened without
    blocking), or None when it is not such a file."""
    try:
        if not stat.S_ISREG(os.lstat(file).st_mode):
            return None
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as handle:
            return handle.read(size)
    except OSError:
        return None


def read_marker(file: Path, *keys: str):
    """The value at ``keys`` in the JSON file ``file`` (a regular file, not followed through a link, opened
    without blocking), or None when it is missing, not such a file or not such JSON."""
    try:
        value = json.loads(read_head(file, MARKER_MAX_BYTES) or b"")  # larger: not JSON
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return value
    except (OSError, ValueError):
        return None


def check_output(out, what: str, is_own, *, overwrite: bool | None, inputs=(), kept=(), option="--out") -> Path:
    """Refuse, before any work, an output hashdist may not write: the root, the current directory or a parent of
    it; one that is, holds or lies inside an input (:func:`check_apart`); a symbolic link; anything that exists and
    is neither an empty directory nor hashdist's own ``what`` (``is_own(path)``: it carries that format's marker),
    since hashdist replaces only what it wrote; its own ``what`` without ``overwrite`` (``overwrite=None``: a
    previous one is replaced without asking, as a report is by a rerun); a lock path that is not a regular file.
    Returns ``out`` as a Path."""
    path = Path(out)
    real, here = path.resolve(), Path.cwd().resolve()
    if real == here or real in here.parents:
        where = "the current directory" if real == here else "a parent of the current directory"
        raise InputError(f"{option} {out}: is {where}; write the output into a new or hashdist-made directory")
    check_apart(out, inputs, option, kept)
    if os.path.islink(path):
        raise InputError(f"{option} {out}: is a symbolic link (to {real}); give the real path, hashdist never "
                         "replaces a link")
    if os.path.lexists(path):
        empty = path.is_dir() and not any(path.iterdir())
        if not empty and not is_own(path):
            raise InputError(f"{option} {out}: exists and is not a hashdist {what}; refusing to replace it (hashdist "
                             "replaces only what it wrote): remove it yourself or choose another path")
        if not empty and overwrite is False:
            raise InputError(f"{out}: output exists (pass --overwrite to replace it)")
    check_lock_path(path)
    return path


def temporary_sibling(final: Path, tag: str = "tmp") -> Path:
    """A fresh hidden path next to ``final`` (same filesystem, so a rename is atomic)."""
    return final.with_name(f".{final.name}.{tag}-{uuid.uuid4().hex[:8]}")


def replace_file(path: Path, text: str) -> None:
    """Write ``text`` to the file ``path`` whole or not at all: a temporary sibling renamed over it (removed if
    the write fails)."""
    tmp = temporary_sibling(path)
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def replace_directory(tmp: Path, final: Path) -> None:
    """Move the finished directory ``tmp`` to ``final``, replacing any previous version."""
    if final.exists():
        old = temporary_sibling(final, "old")
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)


# a lock file is opened without following a link, never truncated, never blocking (a FIFO), by this process only
LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
LOCK_REPLACED_TRIES = 50  # a lock taken on a file another run removed meanwhile: open the new one, this many times


def lock_path_of(target) -> Path:
    """Where the advisory lock of output ``target`` lives while a run writes it: ``.NAME.lock`` beside it, in
    the directory the output's parent really is (two spellings of one output share one lock)."""
    target = Path(os.path.abspath(target))
    if not target.name:
        raise InputError(f"{target}: the root directory is not a place for an output")
    return target.parent.resolve() / f".{target.name}.lock"


def _not_regular(lock: Path, mode: int) -> InputError:
    kind = ("a symbolic link" if stat.S_ISLNK(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
            "a directory" if stat.S_ISDIR(mode) else "not a regular file")
    return InputError(f"{lock}: hashdist's lock file is {kind}, not a regular file; remove it (hashdist never "
                      "follows or truncates it)")


def check_lock_path(target) -> None:
    """Refuse an output whose lock path exists and is not a regular file (a planted link, FIFO or directory)."""
    lock = lock_path_of(target)
    try:
        mode = os.lstat(lock).st_mode
    except OSError:  # missing (the usual case), or unreachable: opening it says why
        return
    if not stat.S_ISREG(mode):
        raise _not_regular(lock, mode)


def _open_lock(target: Path, lock: Path) -> int:
    """A descriptor of the regular file ``lock`` (made if missing, mode 0600), never through a link; an InputError
    naming ``target`` when it cannot be made."""
    try:
        fd = os.open(lock, LOCK_FLAGS, 0o600)
    except OSError as exc:
        with contextlib.suppress(OSError):
            if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                raise _not_regular(lock, os.lstat(lock).st_mode) from None
        raise InputError(f"{target}: cannot write there ({exc.strerror}: {exc.filename})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _not_regular(lock, mode)
    return fd


def _still_there(fd: int, lock: Path) -> bool:
    """Whether the path ``lock`` still names the file ``fd`` holds (a run that ends removes its lock file)."""
    try:
        there = os.lstat(lock)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (there.st_dev, there.st_ino) == (held.st_dev, held.st_ino)


def _locked_fd(target: Path, lock: Path, wait: float, busy: str | None) -> int:
    """``lock`` open and locked, waiting up to ``wait`` seconds while another run holds it (then the InputError
    ``busy``); a lock file that cannot be made, or that is not a regular file, is an InputError at once."""
    deadline = time.monotonic() + wait
    replaced = 0
    while True:
        fd = _open_lock(target, lock)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if time.monotonic() >= deadline:
                raise InputError(busy or f"{target}: another hashdist run is writing this output now") from None
            time.sleep(0.2)
            continue
        if _still_there(fd, lock):
            return fd
        os.close(fd)  # locked a file the run before removed as it ended: lock the one at the path now
        replaced += 1
        if replaced > LOCK_REPLACED_TRIES:
            raise InputError(busy or f"{target}: other hashdist runs keep writing this output") from None


@contextmanager
def exclusive(target, *, wait: float = 0.0, busy: str | None = None) -> Iterator[None]:
    """Hold an advisory lock on output ``target`` for the duration; refuse if another run holds it (after waiting
    up to ``wait`` seconds for it to finish; ``busy``: the refusal's message).

    The lock is flock(2) on ``.NAME.lock`` beside the output (:func:`lock_path_of`), opened without following
    links and never truncated; the file is removed, still locked, when the holder ends, and a run that locked a
    file removed meanwhile locks the new one (so no lock file outlives a run it protects, and no two runs hold
    the same path). Re-entrant within one process: a writer nested in a run that already holds the lock (the CLI
    holds it for the whole run, the report writer again) proceeds.
    """
    target = Path(os.path.abspath(target))
    lock = lock_path_of(target)
    with _held_guard:
        nested = lock in _held
    if nested:
        yield
        return
    created = [d for d in (lock.parent, *lock.parent.parents) if not d.exists()]  # deepest first
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file where a directory should be, no permission, a read-only filesystem
        _remove_new(created)
        raise InputError(f"{target}: cannot write there ({exc.strerror}: {exc.filename})") from None
    try:
        fd = _locked_fd(target, lock, wait, busy)
    except BaseException:
        _remove_new(created)
        raise
    with _held_guard:
        _held.add(lock)
    try:
        yield
    finally:
        with _held_guard:
            _held.discard(lock)
        with contextlib.suppress(OSError):
            lock.unlink()  # while still locked: see above
        os.close(fd)  # releases the lock
        if not target.exists():  # nothing written (bad input found during the run): no directory it made
            _remove_new(created)


def _remove_new(paths) -> None:
    """Remove the empty directories this process made (deepest first), leaving anything else."""
    for path in paths:
        try:
            path.rmdir()
        except OSError:
            return


SETTLE_S = 30.0  # at most this long for the writes an interrupted Zarr call still runs in zarr's IO thread
REMOVE_TRIES = 20  # removals of a staged directory a late write made again, 0.1 s apart


def _settle_zarr_writes(timeout: float = SETTLE_S) -> None:
    """Wait up to ``timeout`` seconds for the tasks on zarr's IO event loop to end. A signal (Ctrl-C, SIGTERM)
    interrupts only the main thread's wait for a Zarr write: the write goes on in zarr's IO thread, and a chunk
    it stores after the staged directory was removed would make that directory again."""
    sync = sys.modules.get("zarr.core.sync")  # never imports zarr: without it there is nothing to wait for
    loop = getattr(sync, "loop", [None])[0]
    if loop is None or loop.is_closed() or not loop.is_running():
        return
    import asyncio  # zarr loaded it: nothing to load here (the launcher reads markers through this module)

    async def the_others():
        current = asyncio.current_task()
        pending = [task for task in asyncio.all_tasks() if task is not current]
        if pending:
            await asyncio.wait(pending, timeout=timeout)

    with contextlib.suppress(Exception):
        asyncio.run_coroutine_threadsafe(the_others(), loop).result(timeout + 1.0)


def remove_staged(tmp: Path) -> None:
    """Remove a staged directory whose writer failed or was interrupted, once the writes still running for it
    (:func:`_settle_zarr_writes`) have ended; again while a late write makes it anew (bounded)."""
    _settle_zarr_writes()
    for _ in range(REMOVE_TRIES):
        shutil.rmtree(tmp, ignore_errors=True)
        time.sleep(0.1)
        if not os.path.lexists(tmp):
            return


_KEPT = "nothing was written (an earlier version stays as it was)"


@contextmanager
def staged_directory(final, *, lock: bool = True) -> Iterator[Path]:
    """Lock ``final``, yield a fresh temporary sibling to build it in, then rename it into place.

    If the body raises, the temporary directory is removed and ``final`` is untouched; a device that cannot take
    the output (full, over quota, read-only: :data:`~hashdist.errors.NO_ROOM`) is then an InputError naming
    ``final``. ``lock=False`` for a directory inside an output whose lock the caller holds (a dataset's ground truth).
    """
    final = Path(final)
    with exclusive(final) if lock else nullcontext():
        tmp = temporary_sibling(final)
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp.mkdir()
            yield tmp
            replace_directory(tmp, final)
        except BaseException as exc:
            remove_staged(tmp)
            if isinstance(exc, OSError) and exc.errno in NO_ROOM:
                raise write_failed(exc, final, "while writing it", _KEPT) from exc
            raise
