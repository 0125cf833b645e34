"""Atomic replacement of output directories: readers see the old complete version or the new one."""

import os
import shutil
import uuid
from pathlib import Path


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
