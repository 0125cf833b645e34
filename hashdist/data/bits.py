"""Binary codes as little-endian uint64 words.

Bit ``i`` of a ``B``-bit code is bit ``i % 64`` of word ``i // 64``; a code takes
``W = ceil(B / 64)`` words and the unused high bits of the last word are zero.
"""

import numpy as np

from hashdist.errors import InputError


def n_words(nbits: int) -> int:
    """Number of uint64 words that hold an ``nbits``-bit code."""
    return (nbits + 63) // 64


def first_wide_row(words: np.ndarray, nbits: int) -> int | None:
    """The first row of (n, W) words with a bit set above ``nbits`` (in the last word's unused high bits), or
    None. One pass over the last word of each row: a few milliseconds per million codes."""
    spare = words.shape[1] * 64 - nbits if words.ndim == 2 and words.shape[1] else 0
    if not 0 < spare < 64:
        return None
    wide = (words[:, -1] >> np.uint64(64 - spare)) != 0
    return int(np.argmax(wide)) if wide.any() else None


def ball_volumes(nbits: int, radius: int) -> list[int]:
    """V_k = sum_{i<=k} C(B, i) for k = 0..radius: codes within distance k, occupied or not (exact integers).

    A running sum with C(B, i+1) = C(B, i) (B - i) / (i + 1): O(radius) big-integer steps.
    """
    volumes, term, total = [], 1, 0
    for i in range(radius + 1):
        total += term
        volumes.append(total)
        term = term * (nbits - i) // (i + 1)
    return volumes


def pack_bits(bits: np.ndarray) -> np.ndarray:
    """Pack an (n, B) array whose entries are 1 for a set bit into (n, W) uint64 words.

    Any entry other than 1 counts as a cleared bit, so {0,1}, {-1,+1} and bool
    arrays all pack the same way; validate values first with :func:`check_code_convention`.
    """
    n, nbits = bits.shape
    padded = np.zeros((n, n_words(nbits) * 64), dtype=np.uint8)
    padded[:, :nbits] = bits == 1
    packed = np.packbits(padded, axis=1, bitorder="little")
    return np.ascontiguousarray(packed).view("<u8").astype(np.uint64, copy=False)


def unpack_bits(words: np.ndarray, nbits: int) -> np.ndarray:
    """Inverse of :func:`pack_bits`: (n, W) uint64 words to an (n, B) uint8 array of 0/1."""
    as_bytes = np.ascontiguousarray(words, dtype="<u8").view(np.uint8)
    return np.unpackbits(as_bytes, axis=1, bitorder="little")[:, :nbits]


def numpy_packed_to_words(packed: np.ndarray, nbits: int, what: str, option: str = "--nbits ") -> np.ndarray:
    """Convert numpy ``packbits`` rows (big bit order, (n, ceil(B/8)) uint8) to words. ``packbits`` pads the
    last byte with 0: a set padding bit means codes wider than ``nbits``, refused (InputError naming ``what``
    and ``option``)."""
    packed = np.asarray(packed, dtype=np.uint8)
    if nbits % 8 and (packed[:, -1] & np.uint8((1 << (8 - nbits % 8)) - 1)).any():
        raise InputError(f"{what}: packed codes have bits set beyond {option}{nbits}")
    return pack_bits(np.unpackbits(packed, axis=1, count=nbits))


def code_values(bits: np.ndarray, what: str) -> set:
    """The distinct values of a block of codes; raise InputError for NaN or values outside {-1, 0, 1}.

    Validate the union over all blocks with :func:`check_code_convention`.
    """
    if bits.dtype.kind not in "biuf":
        raise InputError(f"{what}: codes must be numeric or bool, got dtype {bits.dtype}")
    if bits.dtype.kind == "f" and np.isnan(bits).any():
        raise InputError(f"{what}: codes contain NaN")
    present = {v for v in (-1, 0, 1) if (bits == v).any()}  # a few linear passes, no sort of the block
    if not ((bits == 0) | (bits == 1) | (bits == -1)).all():
        outside = np.unique(bits[(bits != 0) & (bits != 1) & (bits != -1)])
        shown = ", ".join(str(v) for v in outside[:3].tolist())
        raise InputError(f"{what}: code values must be in {{0,1}} or {{-1,+1}}, found {shown}")
    return present


def check_code_convention(values: set, what: str) -> None:
    """Raise InputError unless the values are all in {0, 1} or all in {-1, +1}."""
    if not (values <= {0, 1} or values <= {-1, 1}):
        *rest, last = (str(v) for v in sorted(values))  # a mix has at least -1 and 0
        found = f"{', '.join(rest)} and {last}"
        raise InputError(f"{what}: codes mix the {{0,1}} and {{-1,+1}} conventions (found {found})")


def pack_code_block(bits: np.ndarray, what: str, seen: frozenset = frozenset()) -> tuple[np.ndarray, frozenset]:
    """A block of {0,1} or {-1,+1} codes packed into words, with the values seen so far and in it (one convention
    across all of a stream's blocks: ``seen`` carries the earlier ones)."""
    values = frozenset(seen | code_values(bits, what))
    check_code_convention(values, what)
    return pack_bits(bits), values


def label_kind(labels, name: str) -> str:
    """``"class"`` for 1-D integer labels, ``"multilabel"`` for a 2-D numeric multi-hot matrix with columns
    (its values are checked block by block, by :func:`pack_label_block`)."""
    if labels.ndim == 1:
        if labels.dtype.kind not in "iu":
            raise InputError(f"{name}: class labels must be integers, got {labels.dtype}")
        return "class"
    if labels.ndim == 2:
        if labels.dtype.kind not in "biuf" or labels.shape[1] == 0:
            raise InputError(f"{name}: multi-label matrix must be numeric 0/1 with at least one column")
        return "multilabel"
    raise InputError(f"{name}: labels must be 1-D (classes) or 2-D (multi-hot), got shape {labels.shape}")


def pack_label_block(block: np.ndarray, name: str, kind: str) -> np.ndarray:
    """Labels as a dataset stores them: classes as int64; a 0/1 multi-hot matrix (checked: no NaN, only 0
    and 1) packed into (n, ceil(L/64)) uint64 words."""
    if kind == "class":
        return block.astype(np.int64)
    if block.dtype.kind == "f" and np.isnan(block).any():
        raise InputError(f"{name}: multi-label matrix contains NaN")
    if not np.isin(block, (0, 1)).all():
        raise InputError(f"{name}: multi-label matrix must contain only 0 and 1")
    return pack_bits(block.astype(np.uint8))
