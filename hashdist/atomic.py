"""Output directories: atomic replacement (readers see the old complete version or the new one) and locks."""

import fcntl
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hashdist.errors import InputError


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


@contextmanager
def exclusive(target) -> Iterator[None]:
    """Hold an advisory lock next to ``target`` for the duration; refuse if another run holds it."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(f".{target.name}.lock"), "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(f"{target}: another hashdist run is writing this output now") from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
