"""Blocks of work: queries x database rows, aligned to the dataset's chunks and keyed on what they read.

Shared by the evaluation engine and the ground-truth sweeps. An evaluation block's
key is a digest of its rows and of every parameter its result depends on; its result
is cached under :func:`content_key`, which adds the digests of the rows' content as the
run read it, so a cached result is never one of other data. (The ground-truth sweeps
still key on the dataset's stored chunk fingerprints.)
"""

from __future__ import annotations

from dataclasses import dataclass

from hashdist.data.dataset import combine_digests
from hashdist.errors import InputError, check_integer

MAX_BLOCK_ROWS = 2**31 - 1  # the kernels count a block's items into int32 tables


@dataclass(frozen=True)
class Block:
    """Queries [q0, q1) against database rows [d0, d1); ``key`` is the content key of its result."""

    q0: int
    q1: int
    d0: int
    d1: int
    key: str

    @property
    def pairs(self) -> int:
        return (self.q1 - self.q0) * (self.d1 - self.d0)


def content_key(block: Block, *digests: str) -> str:
    """The cache key of a block's result: its plan key and the content digests of the rows it was computed from
    (hashdist.data.dataset.content_digest)."""
    return combine_digests(("content", block.key, *digests))


def block_rows(rows: int | None, chunk: int, default: int, option: str, total: int) -> int:
    """Rows per block: ``rows`` (or ``default``) rounded up to whole chunks; ``option`` names it in errors. A
    block of the ``total`` rows holds at most MAX_BLOCK_ROWS of them."""
    rows = check_integer(default if rows is None else rows, option)
    rounded = -(-int(rows) // chunk) * chunk
    if min(rounded, total) > MAX_BLOCK_ROWS:
        raise InputError(f"{option} {rows} makes blocks of {min(rounded, total)} rows: at most {MAX_BLOCK_ROWS}, "
                         "as the kernels count a block into int32")
    return rounded


def row_ranges(total: int, step: int) -> list[tuple[int, int]]:
    """[start, stop) ranges of ``step`` rows covering 0..total."""
    return [(start, min(start + step, total)) for start in range(0, total, step)]


def split_by_pairs(blocks, parts: int) -> list[tuple[Block, ...]]:
    """Consecutive runs of blocks with about equal query-item pairs, at most ``parts`` of them."""
    blocks = tuple(blocks)
    total = sum(b.pairs for b in blocks)
    runs, start, done = [], 0, 0
    for i, block in enumerate(blocks):
        done += block.pairs
        if done * parts >= total * (len(runs) + 1) or i == len(blocks) - 1:
            runs.append(blocks[start : i + 1])
            start = i + 1
    return runs
