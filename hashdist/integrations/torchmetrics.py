"""hashdist as a torchmetrics ``Metric`` for training loops: exact, tie-aware retrieval metrics of hash codes.

:class:`HashingMetrics` keeps the database and query codes packed (B/8 bytes a code) with their labels (8 bytes
a class label, L/8 bytes a multi-hot row) and optional sample ids, as list states on the metric's device:
memory O((Q + N)(B + L)/8), never Q x N. ``compute()`` hands them to :class:`hashdist.Evaluator`, so the
numbers are those of :func:`hashdist.evaluate_codes` on the same data, bit for bit.

Codes are binarised by sign: a value > 0 is a set bit, anything else (0, -1, False, a negative or zero
network output) a cleared one. {0,1}, {-1,+1} and bool codes thus mean what they mean to
:func:`hashdist.evaluate_codes`, and an exact 0 of a real-valued output counts as -1.

Under DDP each state is concatenated on its rank and gathered by one ``all_gather`` (after one of every
state's size), so ranks that called ``update_*`` different numbers of times, or never, sync without
deadlock. With ``ids``, rows whose id was seen before (``DistributedSampler``'s padding) are dropped and the
rows ordered by id, so the result does not depend on how the data was sharded.

This module imports torch and torchmetrics; ``import hashdist`` never does.
"""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
import torch
import torch.distributed as dist
from torchmetrics import Metric

from hashdist.arrays import Evaluator
from hashdist.errors import InputError
from hashdist.options import EvaluateOptions, closest

__all__ = ["HashingMetrics", "flat_metrics"]

_SIDES = {"database": "db", "queries": "query"}
_STATES = tuple(f"{prefix}_{what}" for prefix in _SIDES.values() for what in ("codes", "labels", "ids"))
_DTYPES = (torch.uint8, torch.int64)  # a state's dtype, by its code in the size exchange
_BIT_WEIGHTS = (128, 64, 32, 16, 8, 4, 2, 1)  # numpy.packbits' big bit order within a byte
_OPTION_NAMES = frozenset(f.name for f in fields(EvaluateOptions))
_KINDS = (None, "class", "multilabel")


def pack_rows(bits: torch.Tensor) -> torch.Tensor:
    """(n, B) bool rows packed into (n, ceil(B/8)) uint8 rows, laid out as ``numpy.packbits(bits, axis=1)``."""
    n, width = bits.shape
    padded = torch.nn.functional.pad(bits.to(torch.uint8), (0, -width % 8))
    weights = torch.tensor(_BIT_WEIGHTS, dtype=torch.uint8, device=bits.device)
    return (padded.view(n, -1, 8) * weights).sum(dim=2, dtype=torch.uint8)


def _tensor(x, name: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach()
    try:
        return torch.as_tensor(np.asarray(x))
    except Exception as exc:
        raise InputError(f"{name}: not convertible to a tensor ({type(exc).__name__}: {exc})") from None


def binarise(codes, name: str) -> torch.Tensor:
    """Codes as (n, B) bits: a value > 0 is a set bit (so 0 and -1 are cleared bits, and so is an exact 0 of a
    real-valued output); NaN is refused."""
    codes = _tensor(codes, name)
    if codes.ndim != 2 or codes.shape[1] == 0:
        raise InputError(f"{name}: codes must be a 2-D tensor (rows, bits), got shape {tuple(codes.shape)}")
    if codes.dtype == torch.bool:
        return codes
    if codes.is_complex():
        raise InputError(f"{name}: complex codes; give real values, {{0,1}}, {{-1,+1}} or bool")
    if codes.is_floating_point() and bool(torch.isnan(codes).any()):
        raise InputError(f"{name}: codes contain NaN")
    return codes > 0


def _label_rows(labels, name: str, rows: int) -> tuple[torch.Tensor, str, int]:
    """Labels as the state keeps them: (class labels as int64 (n, 1) rows, "class", 0) or (multi-hot rows packed
    to uint8, "multilabel", L)."""
    labels = _tensor(labels, name)
    if labels.shape[:1] != (rows,):
        raise InputError(f"{name}: {labels.shape[0] if labels.ndim else 0} labels but {rows} codes")
    if labels.ndim == 1:
        if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
            raise InputError(f"{name}: class labels must be integers, got {labels.dtype}")
        return labels.to(torch.int64).view(rows, 1), "class", 0
    if labels.ndim != 2 or labels.shape[1] == 0:
        raise InputError(f"{name}: labels must be 1-D (classes) or 2-D (multi-hot), got shape {tuple(labels.shape)}")
    if labels.dtype != torch.bool and bool(((labels != 0) & (labels != 1)).any()):
        raise InputError(f"{name}: multi-label matrix must contain only 0 and 1")
    return pack_rows(labels != 0), "multilabel", int(labels.shape[1])


def _id_rows(ids, name: str, rows: int) -> torch.Tensor:
    ids = _tensor(ids, name)
    if ids.ndim != 1 or ids.shape[0] != rows:
        raise InputError(f"{name}: expected one id per code ({rows}), got shape {tuple(ids.shape)}")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise InputError(f"{name}: ids must be integers, got {ids.dtype}")
    return ids.to(torch.int64).view(rows, 1)


class HashingMetrics(Metric):
    """Exact, tie-aware retrieval metrics of binary hash codes (hashdist's report) as a torchmetrics ``Metric``.

    Keywords: hashdist's evaluate options (``k=[100, 1000]``, ``radius``, ``relevance``, ``conventions``,
    ``engine``, ...: the fields of :class:`hashdist.options.EvaluateOptions`, or the object as ``options=``)
    and torchmetrics' own (``sync_on_compute``, ``process_group``, ``compute_on_cpu``, ...).

    Feed it with :meth:`update_database` and :meth:`update_queries`; :meth:`compute` gives a flat dict of
    scalar tensors of the expected values (for ``self.log_dict``), :meth:`report` the full report document.
    """

    full_state_update = False
    higher_is_better = True
    is_differentiable = False

    def __init__(self, *, options: EvaluateOptions | None = None, **kwargs):
        evaluate = {name: kwargs.pop(name) for name in list(kwargs) if name in _OPTION_NAMES}
        if options is not None and evaluate:
            raise TypeError(f"HashingMetrics(): give options= or the option keywords {sorted(evaluate)}, not both")
        try:
            super().__init__(**kwargs)
        except ValueError as exc:  # torchmetrics names the keywords it does not know: add the closest option's name
            if not str(exc).startswith("Unexpected keyword"):
                raise
            hints = [f"{name!r} (did you mean {close!r}?)" if (close := closest(name, sorted(_OPTION_NAMES)))
                     else repr(name) for name in kwargs]
            raise TypeError(f"HashingMetrics() got unexpected keyword arguments: {', '.join(hints)}") from None
        self.options = options if options is not None else EvaluateOptions(**evaluate)
        for name in _STATES:
            self.add_state(name, default=[], dist_reduce_fx="cat")
        self._clear_meta()

    def _clear_meta(self) -> None:
        self.nbits: int | None = None
        self.label_kind: str | None = None
        self.label_columns = 0
        self._with_ids: dict[str, bool | None] = dict.fromkeys(_SIDES)
        self._last_report: dict | None = None

    def reset(self) -> None:
        super().reset()
        self._clear_meta()

    # -- adding batches ------------------------------------------------------------------

    def update_database(self, codes, labels, ids=None) -> None:
        """Add database items: codes (n, B), labels (n,) classes or (n, L) multi-hot, ids (n,) sample ids."""
        self.update(codes, labels, ids, database=True)

    def update_queries(self, codes, labels, ids=None) -> None:
        """Add queries: codes (n, B), labels (n,) classes or (n, L) multi-hot, ids (n,) sample ids."""
        self.update(codes, labels, ids, database=False)

    def update(self, codes, labels, ids=None, *, database: bool = False) -> None:
        """Add a batch of database items (``database=True``) or queries; see :meth:`update_database`. A batch of
        no rows is checked and adds nothing."""
        side = "database" if database else "queries"
        prefix = _SIDES[side]
        bits = binarise(codes, f"{prefix}_codes")
        rows, width = bits.shape
        if self.nbits is not None and width != self.nbits:
            raise InputError(f"{prefix}_codes: codes have {width} bits but earlier codes have {self.nbits}")
        label_rows, kind, columns = _label_rows(labels, f"{prefix}_labels", rows)
        if self.label_kind is not None and (kind, columns) != (self.label_kind, self.label_columns):
            before = "class labels" if self.label_kind == "class" else f"{self.label_columns} label columns"
            raise InputError(f"{prefix}_labels: {kind} labels of {columns or 1} column(s), but earlier batches have "
                             f"{before}")
        if self._with_ids[side] is not None and self._with_ids[side] != (ids is not None):
            raise InputError(f"{prefix}_ids: give ids with every {side} batch or with none")
        id_rows = None if ids is None else _id_rows(ids, f"{prefix}_ids", rows)
        if rows == 0:  # a batch with no row of this side (e.g. a masked split): nothing to add
            return
        # every check passed: only now does the state change
        self.nbits, self.label_kind, self.label_columns = width, kind, columns
        self._with_ids[side] = ids is not None
        self._last_report = None
        getattr(self, f"{prefix}_codes").append(pack_rows(bits.to(self.device)))
        getattr(self, f"{prefix}_labels").append(label_rows.to(self.device))
        if id_rows is not None:
            getattr(self, f"{prefix}_ids").append(id_rows.to(self.device))

    def forward(self, *args, **kwargs):
        raise TypeError("HashingMetrics has no per-batch value: call update_database() and update_queries(), "
                        "then compute() (or report())")

    # -- computing ------------------------------------------------------------------------

    def compute(self) -> dict[str, torch.Tensor]:
        """The expected value of each headline metric as a scalar float64 tensor: ``map``, ``map@K`` (AP@K over
        the retrieved items), ``precision@K``, ``recall@K``, ``ndcg@K``, ``auc``, and at each radius r
        ``precision@rR``, ``recall@rR``, ``map@rR``, ``mlgap@rR`` (see :func:`flat_metrics`)."""
        self._last_report = self._evaluate()
        return {name: torch.tensor(value, dtype=torch.float64, device=self.device)
                for name, value in flat_metrics(self._last_report).items()}

    def report(self) -> dict:
        """The full report document, the same as :func:`hashdist.evaluate_codes` on the same data gives."""
        self.compute()
        return self._last_report

    def _evaluate(self) -> dict:
        evaluator = Evaluator(nbits=self.nbits) if self.nbits else None
        for side, prefix in _SIDES.items():
            codes = self._rows(f"{prefix}_codes")
            if codes is None or evaluator is None:
                raise InputError(f"update_{side}: no {prefix.replace('db', 'database')} batch was added (on any "
                                 "process)")
            labels, ids = self._rows(f"{prefix}_labels"), self._rows(f"{prefix}_ids")
            if ids is not None:
                if len(ids) != len(codes):
                    raise InputError(f"{prefix}_ids: {len(ids)} ids for {len(codes)} codes (give ids with every "
                                     f"{side} batch on every process, or with none)")
                _, first = np.unique(ids[:, 0], return_index=True)  # sorted by id; a repeated id's first row
                codes, labels = codes[first], labels[first]
            labels = labels[:, 0] if self.label_kind == "class" else np.unpackbits(labels, axis=1,
                                                                                   count=self.label_columns)
            getattr(evaluator, f"add_{side}")(codes, labels)
        return evaluator.compute(options=self._run_options())

    def _run_options(self) -> EvaluateOptions:
        """The options with the device of this metric's states, where the torch engine runs."""
        if self.options.device is None:
            return replace(self.options, device=str(self.device))
        return self.options

    def _rows(self, name: str) -> np.ndarray | None:
        """A state's rows (concatenated over batches and, once synced, processes) as a numpy array."""
        parts = getattr(self, name)
        parts = [parts] if isinstance(parts, torch.Tensor) else parts
        if not parts:
            return None
        return torch.cat(list(parts)).cpu().numpy()

    # -- DDP --------------------------------------------------------------------------------

    def _sync_dist(self, dist_sync_fn=None, process_group=None) -> None:
        """Gather every state across processes: each state concatenated on its rank, one ``all_gather`` of all
        states' sizes (and each rank's code width and label kind), then one ``all_gather`` per state that any rank
        holds rows of (padded to the largest rank's rows, trimmed after). The number of collectives never depends
        on how many batches a rank added. ``dist_sync_fn`` is not used."""
        group = process_group or self.process_group
        local = [self._local_bytes(name) for name in _STATES]
        mine = [[len(rows), rows.shape[1], code] for rows, code in local]
        mine.append([self.nbits or 0, _KINDS.index(self.label_kind), self.label_columns])
        sizes = _all_gather(torch.tensor(mine, dtype=torch.int64, device=self.device), group).cpu()
        self._adopt_meta(sizes[:, -1])
        for i, (name, (rows, _)) in enumerate(zip(_STATES, local, strict=True)):
            setattr(self, name, self._gathered(rows, sizes[:, i], group, name))

    def _local_bytes(self, name: str) -> tuple[torch.Tensor, int]:
        """A state's rows on this rank as one uint8 matrix, and its dtype's code (-1: no rows)."""
        parts = getattr(self, name)
        parts = [parts] if isinstance(parts, torch.Tensor) else parts
        if not parts:
            return torch.zeros((0, 0), dtype=torch.uint8, device=self.device), -1
        rows = torch.cat(list(parts)).contiguous()
        return rows.view(torch.uint8), _DTYPES.index(rows.dtype)

    def _adopt_meta(self, meta: torch.Tensor) -> None:
        """Code width and label kind from the ranks that have them (all of which must agree)."""
        seen = {tuple(row) for row in meta.tolist() if row[0]}
        if len(seen) > 1:
            raise InputError(f"processes disagree on the code width or the labels (bits, kind, columns): "
                             f"{sorted(seen)}")
        if seen:
            nbits, kind, columns = seen.pop()
            self.nbits, self.label_kind, self.label_columns = nbits, _KINDS[kind], columns

    def _gathered(self, rows: torch.Tensor, sizes: torch.Tensor, group, name: str) -> list[torch.Tensor]:
        """One state's rows of every rank, in rank order, as a list of one tensor (empty if no rank has any)."""
        counts, widths, codes = sizes[:, 0], sizes[:, 1], sizes[:, 2]
        held = counts > 0
        if not bool(held.any()):
            return []
        if len(set(widths[held].tolist())) > 1 or len(set(codes[held].tolist())) > 1:
            raise InputError(f"{name}: processes hold rows of different widths or types")
        width, most = int(widths[held][0]), int(counts.max())
        padded = torch.zeros((most, width), dtype=torch.uint8, device=self.device)
        if len(rows):
            padded[: len(rows)] = rows
        gathered = _all_gather(padded, group)
        joined = torch.cat([gathered[rank, :count] for rank, count in enumerate(counts.tolist())])
        return [joined.contiguous().view(_DTYPES[int(codes[held][0])])]


def _all_gather(tensor: torch.Tensor, group) -> torch.Tensor:
    """Every rank's ``tensor`` (all of one shape), stacked in rank order."""
    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, tensor, group=group)
    return torch.stack(out)


def flat_metrics(report: dict) -> dict[str, float]:
    """A report's headline expected values by flat name: ``map``, ``auc``; per cut-off K ``map@K`` (AP@K over
    the retrieved items, as DeepHash's scripts), ``precision@K``, ``recall@K``, ``ndcg@K``; per radius r
    ``precision@rR``, ``recall@rR``, ``map@rR`` and ``mlgap@rR``."""
    m = report["metrics"]
    flat = {"map": m["map"]["expected"], "auc": m["auc"]["expected"]}
    for k in m["precision_at_k"]:
        flat[f"map@{k}"] = m["map_at_k"][k]["retrieved"]["expected"]
        flat[f"precision@{k}"] = m["precision_at_k"][k]["expected"]
        flat[f"recall@{k}"] = m["recall_at_k"][k]["expected"]
        flat[f"ndcg@{k}"] = m["ndcg_at_k"][k]["expected"]
    for r in m["precision_at_radius"]:
        flat[f"precision@r{r}"] = m["precision_at_radius"][r]
        flat[f"recall@r{r}"] = m["recall_at_radius"][r]
        flat[f"map@r{r}"] = m["map_at_radius"][r]["expected"]
        flat[f"mlgap@r{r}"] = m["mlgap_at_radius"][r]
    return {name: float("nan") if value is None else float(value) for name, value in flat.items()}
