"""Output directories: staged writes (readers see the old complete version or the new one) and locks.

Every writer of an output directory uses :func:`staged_directory`: it holds the
output's advisory lock, builds the new version in a hidden temporary sibling and
renames it into place only when the body finished, so an interrupted or failed
write leaves the previous complete output (or none), and two runs never write the
same output at once.
"""

import fcntl
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

from hashdist.errors import NO_ROOM, InputError, write_failed

_held: set[Path] = set()  # lock files this process holds (a nested writer of the same output reuses the lock)
_held_guard = threading.Lock()


def check_apart(out, inputs, option: str = "--out") -> None:
    """Refuse an output that is one of the run's input paths, lies inside one or holds one: writing it (and
    with --overwrite, replacing it) would destroy what the run reads. Inputs that are None, URLs or not on
    disk (as ``<arrays>``) are skipped."""
    target = Path(out).resolve()
    for source in inputs:
        if source is None or "://" in str(source) or not isinstance(source, str | os.PathLike):
            continue
        path = Path(source).resolve()
        if not path.exists():
            continue
        if target == path or target in path.parents or path in target.parents:
            how = "is" if target == path else "holds" if target in path.parents else "lies inside"
            raise InputError(f"{option} {out}: {how} the input {source}; write the output elsewhere")


def temporary_sibling(final: Path, tag: str = "tmp") -> Path:
    """A fresh hidden path next to ``final`` (same filesystem, so a rename is atomic)."""
    return final.with_name(f".{final.name}.{tag}-{uuid.uuid4().hex[:8]}")


def replace_directory(tmp: Path, final: Path) -> None:
    """Move the finished directory ``tmp`` to ``final``, replacing any previous version."""
    if final.exists():
        old = temporary_sibling(final, "old")
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)


def _locked_handle(target: Path, lock_path: Path, created: list[Path], wait: float, busy: str | None):
    """``lock_path`` open and locked, waiting up to ``wait`` seconds while another run holds it (then the InputError
    ``busy``); a lock file that cannot be made is an InputError at once (waiting would not help)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            handle = open(lock_path, "w")
        except OSError as exc:  # a file where a directory should be, no permission, a read-only filesystem
            _remove_new(created)
            raise InputError(f"{target}: cannot write there ({exc.strerror}: {exc.filename})") from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle
        except BlockingIOError:
            handle.close()
            if time.monotonic() >= deadline:
                raise InputError(busy or f"{target}: another hashdist run is writing this output now") from None
        time.sleep(0.2)


@contextmanager
def exclusive(target, *, wait: float = 0.0, busy: str | None = None) -> Iterator[None]:
    """Hold an advisory lock next to ``target`` for the duration; refuse if another run holds it (after waiting
    up to ``wait`` seconds for it to finish; ``busy``: the refusal's message).

    Re-entrant within one process: a writer nested in a run that already holds the lock
    (the CLI holds it for the whole run, the report writer again) proceeds.
    """
    target = Path(target).absolute()
    lock_path = target.with_name(f".{target.name}.lock")
    with _held_guard:
        nested = lock_path in _held
    if nested:
        yield
        return
    created = [d for d in (target.parent, *target.parent.parents) if not d.exists()]  # deepest first
    new_lock = not lock_path.exists()
    with _locked_handle(target, lock_path, created, wait, busy) as handle:
        with _held_guard:
            _held.add(lock_path)
        try:
            yield
        except BaseException:
            # nothing written: a run that failed (bad input found during it) leaves no lock file or directory
            # it made, unless the output exists after all (a nested writer finished it)
            if not target.exists():
                _remove_new(([lock_path] if new_lock else []) + created)
            raise
        finally:
            with _held_guard:
                _held.discard(lock_path)
            fcntl.flock(handle, fcntl.LOCK_UN)


def _remove_new(paths) -> None:
    """Remove the lock file and the empty directories this process made (in order), leaving anything else."""
    for path in paths:
        try:
            path.rmdir() if path.is_dir() else path.unlink()
        except OSError:
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
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(exc, OSError) and exc.errno in NO_ROOM:
                raise write_failed(exc, final, "while writing it", _KEPT) from exc
            raise
