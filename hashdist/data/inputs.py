"""Arrays a user hands in: .npy/.npz files loaded without pickles, and real-valued query scores checked."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hashdist.errors import InputError


def _npy_dtype(path) -> np.dtype | None:
    """The dtype in a .npy file's header, None for a .npz (a zip); InputError for any other file."""
    with open(path, "rb") as f:
        magic = f.read(6)
        if magic.startswith(b"PK\x03\x04"):
            return None
        if magic != b"\x93NUMPY":
            raise InputError(f"{path}: not a .npy/.npz file")
        f.seek(0)
        read_header = np.lib.format.read_array_header_1_0
        if np.lib.format.read_magic(f) != (1, 0):
            read_header = np.lib.format.read_array_header_2_0
        return read_header(f)[2]


def load_array(path) -> np.ndarray:
    """Memory-map a .npy (or load the single array of a .npz); refuse pickles and bad files."""
    path = str(path)
    name, _, key = path.partition(".npz:")
    if key:
        path = name + ".npz"
    if not Path(path).is_file():
        raise InputError(f"{path}: no such file")
    pickled = InputError(f"{path}: contains a pickled object array (hashdist never loads pickles)")
    try:
        dtype = _npy_dtype(path)
        if dtype is not None and dtype.hasobject:
            raise pickled
        loaded = np.load(path, mmap_mode="r", allow_pickle=False)
    except InputError:
        raise
    except ValueError as exc:
        raise InputError(f"{path}: not a readable .npy/.npz file ({exc})") from None
    except Exception as exc:
        raise InputError(f"{path}: not a readable .npy/.npz file ({type(exc).__name__})") from None
    if isinstance(loaded, np.lib.npyio.NpzFile):
        with loaded:
            names = loaded.files
            if key:
                if key not in names:
                    raise InputError(f"{path}: has no array {key!r} (has {', '.join(names)})")
                names = [key]
            if len(names) != 1:
                raise InputError(f"{path}: holds {len(names)} arrays; name one as {path}:NAME")
            try:
                loaded = loaded[names[0]]
            except ValueError:
                raise pickled from None
    return loaded


def check_scores(scores, nbits: int, n_queries: int, name: str = "--query-scores") -> np.ndarray:
    """Real-valued query vectors as float64 (Q, B), finite: kept as given (a float32 input exactly), so the
    certified interval is the one of the ranking by these values."""
    y = np.asarray(scores)
    if y.dtype.kind != "f":
        raise InputError(f"{name}: query scores must be float32 or float64, got dtype {y.dtype}")
    if y.shape != (n_queries, nbits):
        raise InputError(f"{name}: query scores must have shape ({n_queries}, {nbits}), got {y.shape}")
    if not np.isfinite(y).all():
        raise InputError(f"{name}: query scores contain NaN or infinity")
    return np.ascontiguousarray(y, dtype=np.float64)
