"""Per-block Hamming histograms ``H[q, d, g]`` with torch operations on a device: the torch engine.

The same histograms as :func:`hashdist.kernels.histogram.histogram_block`, computed where the tensors live (a
CUDA device, or the CPU): the code words are XORed and their bits counted by SWAR on int64 words (torch has no
popcount operator), each pair's grade is label equality (classes) or the labels in common (multi-hot words, a
SWAR count of their AND, capped at ``max_grade``), and ``bincount`` over ``q * (B + 1) * G + d * G + g`` adds
the pairs up. The block is walked in sub-blocks of at most :func:`pair_budget` pairs, so no Q x N tensor is
ever formed; only the integer histogram returns to the CPU. Explicit ground truth is the numba kernel's
correction afterwards (each listed pair moved from grade 0 to its grade).

torch is imported inside the functions: importing this module does not import it.
"""

from __future__ import annotations

import numpy as np

from hashdist.kernels.histogram import _apply_explicit, explicit_lists, n_grades

CPU_PAIR_BUDGET = 1 << 21  # pairs per sub-block on the CPU: ~10 int64 temporaries of 16 MiB each
DEVICE_MEMORY_SHARE = 4  # a sub-block's temporaries use at most 1/4 of the device's free memory...
BYTES_PER_PAIR = 80  # ...at about this many bytes per pair (distance, grade, cell, XOR and SWAR temporaries)
MAX_PAIR_BUDGET = 1 << 28
_M1, _M2, _M4, _H01 = 0x5555555555555555, 0x3333333333333333, 0x0F0F0F0F0F0F0F0F, 0x0101010101010101


def pair_budget(device) -> int:
    """Pairs per sub-block: CPU_PAIR_BUDGET on the CPU; on an accelerator, what fits in a share of its free
    memory (at least 2^16, at most MAX_PAIR_BUDGET)."""
    import torch

    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(max(1 << 16, min(MAX_PAIR_BUDGET, free // DEVICE_MEMORY_SHARE // BYTES_PER_PAIR)))
    return CPU_PAIR_BUDGET


def popcount64(x):
    """Set bits of each int64 word (SWAR), computed in place in ``x`` (give a temporary). Arithmetic shifts are
    harmless: every mask clears the sign bits they bring in, and the final byte count is < 128."""
    t = x >> 1
    x -= t.bitwise_and_(_M1)
    t = x >> 2
    x.bitwise_and_(_M2).add_(t.bitwise_and_(_M2))
    x += x >> 4
    x.bitwise_and_(_M4).mul_(_H01)
    return x.bitwise_right_shift_(56)


def as_device_words(words, device):
    """uint64 word rows (numpy) or an integer tensor as an int64 tensor on ``device`` (same bits)."""
    import torch

    if isinstance(words, torch.Tensor):
        return words.to(device=device, dtype=torch.int64)
    return torch.from_numpy(np.ascontiguousarray(words, dtype=np.uint64).view(np.int64)).to(device)


def _distances(qw, dw):
    """(qs, ds) Hamming distances of word rows, one word at a time (never a (qs, ds, words) tensor)."""
    d = popcount64(qw[:, None, 0] ^ dw[None, :, 0])
    for w in range(1, qw.shape[1]):
        d += popcount64(qw[:, None, w] ^ dw[None, :, w])
    return d


def _grades(kind: str, ql, dl, top: int):
    """(qs, ds) grades: 1 for equal class labels; labels in common (capped at ``top``) for multi-hot words; 0
    for explicit ground truth (corrected afterwards)."""
    if kind == "class":
        return (ql[:, None] == dl[None, :]).to(ql.dtype)
    if kind == "multilabel":
        return _labels_in_common(ql, dl).clamp_(max=top)
    return None


def _labels_in_common(ql, dl):
    common = popcount64(ql[:, None, 0] & dl[None, :, 0])
    for w in range(1, ql.shape[1]):
        common += popcount64(ql[:, None, w] & dl[None, :, w])
    return common


def _steps(n_queries: int, n_items: int, budget: int) -> tuple[int, int]:
    """(queries, items) per sub-block, with queries x items <= budget."""
    items = max(1, min(n_items, budget // max(1, n_queries)))
    return max(1, min(n_queries, budget // items)), items


def torch_histogram_block(query_codes, db_codes, nbits: int, kind: str, query_rel=None, db_rel=None, *,
                          db_start: int = 0, max_grade: int = 1, device="cpu", budget: int | None = None
                          ) -> np.ndarray:
    """Histogram of a query block against a database block, shape (Qb, nbits + 1, n_grades), int64 numpy;
    arguments as :func:`hashdist.kernels.histogram.histogram_block`'s, plus the ``device`` to compute on and the
    ``budget`` of pairs per sub-block (default :func:`pair_budget`)."""
    import torch

    dev = torch.device(device)
    qc, dc = as_device_words(query_codes, dev), as_device_words(db_codes, dev)
    ncols, cells = n_grades(kind, max_grade), nbits + 1
    ql = dl = None
    if kind == "class":
        ql, dl = (torch.as_tensor(np.asarray(x, dtype=np.int64), device=dev) for x in (query_rel, db_rel))
    elif kind == "multilabel":
        ql, dl = as_device_words(query_rel, dev), as_device_words(db_rel, dev)
    elif kind != "explicit":
        raise ValueError(f"unknown relevance kind {kind!r}")
    Q, N = qc.shape[0], dc.shape[0]
    H = torch.zeros(Q * cells * ncols, dtype=torch.int64, device=dev)
    q_step, d_step = _steps(Q, N, budget or pair_budget(dev))
    for q0 in range(0, Q, q_step):
        q1 = min(Q, q0 + q_step)
        rows = (torch.arange(q1 - q0, device=dev) * (cells * ncols))[:, None]
        part = H[q0 * cells * ncols : q1 * cells * ncols]
        for d0 in range(0, N, d_step):
            d1 = min(N, d0 + d_step)
            cell = rows + _distances(qc[q0:q1], dc[d0:d1]) * ncols
            grade = None if ql is None else _grades(kind, ql[q0:q1], dl[d0:d1], ncols - 1)
            if grade is not None:
                cell += grade
            part += torch.bincount(cell.view(-1), minlength=part.shape[0])
    H = H.view(Q, cells, ncols).cpu().numpy()
    if kind == "explicit":
        _apply_explicit(np.ascontiguousarray(query_codes, dtype=np.uint64),
                        np.ascontiguousarray(db_codes, dtype=np.uint64), db_start, *explicit_lists(query_rel),
                        max_grade, H)
    return H
