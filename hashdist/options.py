"""The options of a run, each declared once: its type, default and help text live in a field here, and the CLI's
flags, the Python API's keywords, the flows' parameters and ``deploy/prefect.yaml`` all derive from it.

An options object checks at construction what needs no dataset (types, choices, ranges) and raises
:class:`~hashdist.errors.InputError` naming the option; :meth:`EvaluateOptions.resolve` checks once against
the dataset what does (K against N, radii against B, the protocol's cut-offs, the distance's bins) and plans
the blocks. Nothing below it checks again.
"""

from __future__ import annotations

import difflib
import importlib.util
import math
import os
import re
import typing
from collections.abc import Iterable
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, Literal, NamedTuple

import numpy as np

from hashdist.data.dataset import Dataset, open_dataset, parse_task
from hashdist.data.protocols import PROTOCOLS, get_protocol, protocol_k
from hashdist.defaults import (
    DEFAULT_BETA,
    DEFAULT_BOOTSTRAP,
    DEFAULT_DB_BLOCK_ROWS,
    DEFAULT_DISTANCE_BINS,
    DEFAULT_K,
    DEFAULT_PERMUTATIONS,
    DEFAULT_QUERY_BLOCK_ROWS,
    DEFAULT_RADII,
    DEFAULT_SEED,
    GROUNDTRUTH_NEIGHBORS,
    GROUNDTRUTH_PERCENT,
    GROUNDTRUTH_QUERY_BLOCK_ROWS,
    GROUNDTRUTH_SAMPLE,
)
from hashdist.engine.blocks import block_rows
from hashdist.engine.plan import MAX_GRADE, Plan, make_plan
from hashdist.errors import InputError, check_integer, check_number, is_integer, json_object
from hashdist.kernels.distance import KINDS, DistanceAxis, asymmetric_axis, check_bins, check_weights, weighted_axis
from hashdist.metrics.conventions import BY_NAME, CONVENTIONS
from hashdist.metrics.summary import EMPTY_QUERY_RULES, MetricParams
from hashdist.served.engine import ServedRun, refuse_early
from hashdist.served.lists import check_width, parse_served, read_served, split_key
from hashdist.served.measures import ORDERS

_NUMBER = (int, float, np.integer, np.floating)
_HASHTABLE = re.compile(r"\s*(\d+)\s*[xX]\s*(\d+)\s*")  # the whole setting (fullmatch)
ConventionName = Literal[tuple(BY_NAME)]  # type: ignore[valid-type]
ProtocolName = Literal[tuple(p.name for p in PROTOCOLS)]  # type: ignore[valid-type]


def option(help: str, **cli) -> dict:
    """A field's metadata: its help text ({default} stands for the default) and how the CLI takes it (argparse
    keywords: flag, type, nargs, metavar, action)."""
    return {"help": help, "cli": cli}


def help_text(f) -> str:
    """A field's help with its default filled in."""
    default = f.default if f.default is not MISSING else None
    shown = " ".join(map(str, default)) if isinstance(default, tuple) else default
    return f.metadata["help"].format(default=shown)


@dataclass(frozen=True, kw_only=True)
class EvaluateOptions:
    """What ``hashdist evaluate`` computes. ``k``, ``radius``, ``hashtable`` and ``conventions`` take one value or
    a list (a string is one value)."""

    k: tuple[int, ...] | None = field(default=None, metadata=option(
        f"cut-offs K (default: the protocol's, else {' '.join(map(str, DEFAULT_K))})", type=int, nargs="+"))
    radius: tuple[int | float, ...] = field(default=DEFAULT_RADII, metadata=option(
        "radii r, in bits (Hamming) or in the distance's units (default {default}); mLGAP is at the integer radii, "
        "in Hamming bits", type="number", nargs="+"))
    distance: Literal["hamming", "weighted", "asymmetric"] | None = field(default=None, metadata=option(
        "the ranking distance: plain Hamming (default), weighted Hamming (default with --bit-weights) or asymmetric "
        "-y.b against the queries' real-valued scores (ingest --query-scores). A real-valued distance is counted in "
        "bins, ties within a bin: each order-dependent metric's [worst, best] then certainly holds the unbinned "
        "value (docs/metrics.md, section 4b)"))
    bit_weights: Any = field(default=None, metadata=option(
        "per-bit weights, (B,) or one row per query (Q, B), finite and >= 0; integer weights give exact results "
        "(from Python also an array)", metavar="W.npy"))
    distance_bins: int = field(default=DEFAULT_DISTANCE_BINS, metadata=option(
        "bins of a real-valued distance (default {default}); more bins, narrower certified intervals", metavar="G"))
    beta: float = field(default=DEFAULT_BETA, metadata=option("F-beta's beta (default {default:g})"))
    empty_queries: Literal["exclude", "zero"] = field(default="exclude", metadata=option(
        "queries without relevant items: excluded from means (default) or counted as 0"))
    relevance: Literal["class", "multilabel", "explicit"] | None = field(default=None, metadata=option(
        "default: the dataset's"))
    max_grade: int | None = field(default=None, metadata=option(
        "count grades (multi-label: labels in common; explicit: listed grades) above G as G, G <= {MAX_GRADE}; "
        "default: uncapped, and grades above {MAX_GRADE} refused. The report records the cap and how many relevant "
        "pairs it changed".format(MAX_GRADE=MAX_GRADE), metavar="G"))
    hashtable: tuple[str, ...] = field(default=(), metadata=option(
        "hashtable-bucket paradigm: L tables of K-bit substrings, e.g. 8x8 16x4", nargs="+", metavar="KxL"))
    protocol: ProtocolName | None = field(default=None, metadata=option(
        "a literature protocol: its mAP@K cut-offs (unless --k) and its script's convention; "
        + ", ".join(p.name for p in PROTOCOLS) + " (docs/protocols.md)", metavar="NAME"))
    conventions: tuple[ConventionName, ...] = field(default=(), metadata=option(
        "also report mAP@K as a published script computes it (repeatable): "
        + "; ".join(f"{c.name}: {c.reproduces}" for c in CONVENTIONS), flag="--convention", action="append",
        metavar="NAME"))
    tasks: tuple[str, ...] = field(default=(), metadata=option(
        "a dataset with modalities: the task QUERY->DATABASE to evaluate (repeatable), e.g. image->text or "
        "image->image; default: every cross task (image->text and text->image)", flag="--task", action="append",
        metavar="A->B"))
    served: Any = field(default=None, metadata=option(
        "a deployed index's served lists, evaluated against the exhaustive ranking (repeatable): NAME=PATH, PATH a "
        ".npz (I, D; a radius lookup: lims, I, D, radius, the inclusive Hamming radius), .npy (I), ann-benchmarks "
        "HDF5, a TREC run or big-ann-benchmarks binary; PATH:1based for 1-based ids; A->B:NAME=PATH for a task of a "
        "dataset with modalities (from Python also arrays: I, (I, D) or a dict; docs/served.md)", flag="--served",
        action="append", metavar="NAME=PATH"))
    served_order: Literal["distance", "as-served"] = field(default="distance", metadata=option(
        "how served entries are ranked: by their recomputed distance, entries tied at one distance giving the "
        "interval (default), or as-served: in the index's order (one value)"))
    query_block_rows: int | None = field(default=None, metadata=option(
        f"queries per block (default {DEFAULT_QUERY_BLOCK_ROWS}; rounded up to whole chunks)"))
    db_block_rows: int | None = field(default=None, metadata=option(
        f"database rows per block (default {DEFAULT_DB_BLOCK_ROWS}; rounded up to whole chunks; at most 2^31 - 1)"))
    code_parts: int | None = field(default=None, metadata=option(
        "split the database's distinct codes (for mLGAP and code usage) into P parts by hash, each merged and "
        "searched on its own (default: one per 2M items, and at least one per thread); results never depend on "
        "P, memory per part does", metavar="P"))
    # Python API only (the command line's --engine is ExecutionOptions'): where the histograms are counted
    engine: Literal["auto", "numba", "torch"] = field(default="auto", metadata={"help": (
        "histogram engine: numba on the CPU, or torch on the device (hashdist[torch]); auto: torch when the "
        "device is a CUDA device, else numba (default {default}). Results are identical")})
    device: str | None = field(default=None, metadata={"help": (
        "the torch engine's device, e.g. cuda:0 (default: the codes' device when they are tensors, else cpu)")})

    def __post_init__(self):
        set_ = object.__setattr__  # normalising a frozen instance's own fields, once
        if self.k is not None:
            set_(self, "k", _listed(self.k, "--k / k=", _NUMBER, "a number"))
        radius = _listed(self.radius, "--radius / radius=", _NUMBER, "a number")
        set_(self, "radius", tuple(int(r) if float(r).is_integer() else float(r) for r in radius))  # key "2"
        set_(self, "hashtable", _listed(self.hashtable, "--hashtable / hashtable=", str, "a KxL setting"))
        set_(self, "conventions", _listed(self.conventions, "--convention / conventions=", str,
                                          "a convention name"))
        tasks = tuple("->".join(parse_task(t)) for t in _listed(self.tasks, "--task / tasks=", str, "a task A->B"))
        if len(set(tasks)) < len(tasks):
            raise InputError(f"--task: {sorted(t for t in tasks if tasks.count(t) > 1)[0]} is given twice")
        set_(self, "tasks", tasks)
        set_(self, "served", parse_served(self.served))
        self._check_choices()
        self._check_numbers()

    def _check_choices(self) -> None:
        if self.distance is not None and self.distance not in KINDS:
            raise InputError(f"--distance {self.distance!r}: unknown (known: {', '.join(KINDS)})")
        if self.empty_queries not in EMPTY_QUERY_RULES:
            raise InputError(f"--empty-queries must be one of {EMPTY_QUERY_RULES}, got {self.empty_queries!r}")
        for name in self.conventions:
            if name == "hashdist":
                raise InputError("--convention 'hashdist': hashdist's own convention is always reported (map_at_k, "
                                 f"with every normaliser); the others: {', '.join(BY_NAME)}")
            if name not in BY_NAME:
                raise InputError(f"--convention {name!r}: unknown convention (known: {', '.join(BY_NAME)})")
        if self.served_order not in ORDERS:
            raise InputError(f"--served-order must be one of {', '.join(ORDERS)}, got {self.served_order!r}")
        if self.protocol is not None:
            get_protocol(self.protocol)
        self._check_engine()
        for spec in self.hashtable:
            parse_hashtable(spec)

    def _check_engine(self) -> None:
        engines = typing.get_args(typing.get_type_hints(EvaluateOptions)["engine"])
        if self.engine not in engines:
            raise InputError(f"engine={self.engine!r}: unknown (known: {', '.join(engines)})")
        if self.device is not None and not isinstance(self.device, str):
            raise InputError(f"device={self.device!r}: expected a device name such as 'cpu' or 'cuda:0'")
        if self.histogram_engine == "torch" and importlib.util.find_spec("torch") is None:
            raise InputError("engine='torch' needs torch: pip install 'hashdist[torch]'")

    @property
    def histogram_engine(self) -> str:
        """The engine that counts the histograms: as given, or for auto torch on a CUDA device, else numba."""
        if self.engine != "auto":
            return self.engine
        return "torch" if (self.device or "cpu").startswith("cuda") else "numba"

    def _check_numbers(self) -> None:
        if self.k is not None and (not self.k or any(not 1 <= k < math.inf or int(k) != k for k in self.k)):
            raise InputError(f"--k: every K must be a positive integer, got {list(self.k)}")
        if not self.radius:
            raise InputError("--radius: give at least one radius")
        if not (isinstance(self.beta, (int, float)) and math.isfinite(self.beta) and self.beta > 0):
            raise InputError(f"--beta must be a finite number > 0, got {self.beta}")
        if self.max_grade is not None:
            check_integer(self.max_grade, "--max-grade", 1, MAX_GRADE)
        if self.code_parts is not None:
            check_integer(self.code_parts, "--code-parts")
        check_bins(self.distance_bins)

    def as_parameters(self) -> EvaluateOptions:
        """These options as a flow run's parameters once its runs are prepared: array inputs named ("arrays",
        "array", as the report records them), not carried (Prefect sends parameters to its API and with every
        task)."""
        served = {key: source if isinstance(source, (str, os.PathLike)) else "arrays"
                  for key, source in self.served.items()}
        weights = self.bit_weights
        return replace(self, served=served, bit_weights=weights if weights is None or isinstance(
            weights, (str, os.PathLike)) else "array")

    @property
    def distance_kind(self) -> str:
        """The ranking distance: as given, else weighted with bit weights, else Hamming."""
        return self.distance or ("weighted" if self.bit_weights is not None else "hamming")

    def resolve_tasks(self, dataset) -> tuple[PreparedRun, ...]:
        """One prepared run per task: on a dataset with modalities the tasks asked for (default: its cross
        tasks), on one without the dataset's single run."""
        ds = open_dataset(dataset, self.tasks[0] if self.tasks else None)
        if not ds.modalities:
            return (self.resolve(ds),)
        tasks = self.tasks or ds.tasks
        for key in self.served:
            task = split_key(key)[0]
            if task is not None and task not in tasks:
                raise InputError(f"--served {key}: the run evaluates {', '.join(tasks)}, not {task} (add --task "
                                 f"{task})")
        return tuple(self.resolve(ds.for_task(task)) for task in tasks)

    def resolve(self, dataset) -> PreparedRun:
        """Open the dataset (a path, or a :class:`Dataset` already open: a task's view), check the options against
        it and plan the blocks (once per run)."""
        ds = dataset if isinstance(dataset, Dataset) else open_dataset(dataset, self.tasks[0] if self.tasks else None)
        if ds.modalities and self.distance_kind == "asymmetric":
            raise InputError(f"{ds.url}: --distance asymmetric is not available for a dataset with modalities")
        k, conventions = self.k, self.conventions
        if self.protocol is not None:
            preset = get_protocol(self.protocol)
            k = protocol_k(preset, ds.n_database) if k is None else k
            conventions = tuple(dict.fromkeys((*conventions, preset.convention)))
        k = _listed(DEFAULT_K if k is None else k, "--k / k=", _NUMBER, "a number")
        hashtables = tuple(parse_hashtable(spec, ds.nbits) for spec in self.hashtable)
        settings = tuple(f"{bits}x{tables}" for bits, tables in hashtables)
        params = MetricParams(k, self.radius, float(self.beta), self.empty_queries, settings, self.max_grade,
                              ds.n_database, conventions=conventions, distance=self.distance_kind)
        _check_against(params, ds.nbits)
        axis = self._distance_axis(ds)
        if axis is not None:
            params = replace(params, radius_bins=tuple(axis.position(r) for r in params.radii),
                             bin_edges=tuple(axis.upper.tolist()))
        plan = make_plan(ds, relevance=self.relevance, max_radius=params.max_radius,
                         query_block_rows=self.query_block_rows, db_block_rows=self.db_block_rows,
                         hashtables=hashtables, distance=axis, code_parts=self.code_parts, max_grade=self.max_grade)
        if self.histogram_engine == "torch":
            plan = replace(plan, engine="torch", device=self.device or "cpu")
        served = self._served(ds, plan, params)
        return PreparedRun(ds, params, plan, self._parameters(params, plan, axis), served)

    def _served(self, ds: Dataset, plan: Plan, params: MetricParams) -> tuple:
        """The served runs of this dataset (or task): read and checked against the dataset's sizes; their entries'
        distances and grades are recomputed, and checked, by the metric items (hashdist.served.engine)."""
        runs = []
        for key, source in self.served.items():
            task, name = split_key(key)
            if ds.modalities and task is None:
                raise InputError(f"--served {name}: {ds.url} has modalities; name the task the lists answer, e.g. "
                                 f"--served '{ds.tasks[0]}:{name}=PATH'")
            if not ds.modalities and task is not None:
                raise InputError(f"--served {key}: a task, but {ds.url} has no modalities (give NAME=PATH)")
            if task is not None and task != plan.task:
                continue
            if params.distance != "hamming":
                raise InputError(f"--served {name}: served lists are evaluated against the Hamming ranking, not "
                                 f"--distance {params.distance}")
            run = read_served(key, source, ds.n_queries, ds.n_database, ds.nbits)
            check_width(run, params.ks)
            runs.append(ServedRun(run, self.served_order))
            refuse_early(ds, plan, runs[-1])
        return tuple(runs)

    def _parameters(self, params: MetricParams, plan: Plan, axis: DistanceAxis | None) -> dict:
        """The run's parameters as the report records them."""
        weights = self.bit_weights
        return {
            "k": list(params.ks), "radius": list(params.radii), "beta": params.beta,
            "empty_queries": params.empty_queries, "relevance": plan.relevance, "max_grade": params.max_grade,
            "query_block_rows": plan.query_block_rows, "db_block_rows": plan.db_block_rows,
            "hashtable": list(params.hashtables), "protocol": self.protocol, "conventions": list(params.conventions),
            "distance": params.distance,
            "bit_weights": None if weights is None else str(weights) if isinstance(weights, (str, os.PathLike))
            else "array",
            "distance_bins": None if axis is None else axis.bins,
            "served": {key: source if isinstance(source, str) else str(source) if isinstance(source, os.PathLike)
                       else "arrays" for key, source in self.served.items()},
            "served_order": self.served_order,
            **({"task": plan.task} if plan.task else {}),
        }

    def _distance_axis(self, ds: Dataset) -> DistanceAxis | None:
        """The bins of a weighted or asymmetric distance (hashdist.kernels.distance), or None for plain Hamming."""
        distance, weights, radii = self.distance_kind, self.bit_weights, self.radius
        if distance != "weighted" and weights is not None:
            raise InputError(f"--bit-weights: only with --distance weighted, not {distance}")
        if distance == "hamming":
            return None
        bins = check_bins(self.distance_bins)
        if distance == "weighted":
            if weights is None:
                raise InputError("--distance weighted needs --bit-weights W.npy")
            if isinstance(weights, (str, os.PathLike)):
                from hashdist.data.inputs import load_array

                weights = load_array(weights)
            return weighted_axis(check_weights(weights, ds.nbits, ds.n_queries), bins, radii)
        if not ds.has("queries/scores"):
            raise InputError(f"{ds.url}: --distance asymmetric needs the queries' real-valued scores "
                             "(hashdist ingest --query-scores)")
        from hashdist.data.inputs import check_scores

        scores = check_scores(ds.read("queries/scores", 0, ds.n_queries), ds.nbits, ds.n_queries, "queries/scores")
        return asymmetric_axis(scores, bins, radii, ds.fingerprints["queries/scores"].digest)


class PreparedRun(NamedTuple):
    """A run checked against its dataset: the dataset, what to compute, the blocks, the report's parameters."""

    ds: Dataset
    params: MetricParams
    plan: Plan
    parameters: dict
    served: tuple = ()  # hashdist.served.engine.ServedRun, one per served run


def _check_against(params: MetricParams, nbits: int) -> None:
    """The radii against the code length and the distance (the rest was checked at construction)."""
    radii = list(params.radii)
    if params.distance == "hamming" and any(not 0 <= r <= nbits or int(r) != r for r in radii):
        raise InputError(f"--radius: every radius must be an integer in 0..{nbits}, got {radii}")
    if params.distance != "hamming" and not all(math.isfinite(r) for r in radii):
        raise InputError(f"--radius: every radius must be a finite number, got {radii}")
    if params.distance == "weighted" and any(r < 0 for r in radii):
        raise InputError(f"--radius: a weighted Hamming radius must be >= 0, got {radii}")


def parse_hashtable(spec: str, nbits: int | None = None) -> tuple[int, int]:
    """``"KxL"`` (bits per substring x number of tables) to (K, L); with ``nbits``, also check K*L <= B."""
    match = _HASHTABLE.fullmatch(str(spec))
    if not match or int(match[1]) < 1 or int(match[2]) < 1:
        raise InputError(f"hashtable {spec!r}: expected KxL with positive integers, e.g. 8x4 (K bits, L tables)")
    k_bits, n_tables = int(match[1]), int(match[2])
    if nbits is not None and k_bits * n_tables > nbits:
        raise InputError(f"hashtable {spec}: K*L = {k_bits * n_tables} exceeds the {nbits}-bit codes")
    return k_bits, n_tables


def _listed(value, name: str, kinds, what: str) -> tuple:
    """An option given as one value or an iterable of values (a string is one value), as a tuple of ``kinds``."""
    listed = isinstance(value, Iterable) and not isinstance(value, str) and getattr(value, "ndim", 1)  # not 0-d
    values = tuple(value) if listed else (value,)
    if not all(isinstance(v, kinds) and not isinstance(v, bool) for v in values):
        raise InputError(f"{name}: expected {what} or a list of them, got {value!r}")
    return values


@dataclass(frozen=True, kw_only=True)
class ExecutionOptions:
    """Where and how a run's blocks run: the engine, the cluster (an existing one by address, a per-run one by
    class, or the embedded LocalCluster), threads, the block cache and progress. No result depends on them."""

    engine: Literal["flow", "local"] = field(default="flow", metadata=option(
        "flow: Prefect + Dask; local: threads in this process (default {default})"))
    address: str | None = field(default=None, metadata=option(
        "existing Dask scheduler, tcp://HOST:PORT or tls://HOST:PORT (default $HASHDIST_DASK_ADDRESS)"))
    cluster_class: str | None = field(default=None, metadata=option(
        "per-run cluster class, e.g. dask_jobqueue.SLURMCluster (default $HASHDIST_CLUSTER_CLASS)"))
    cluster_kwargs: dict | None = field(default=None, metadata=option(
        "JSON keyword arguments for --cluster-class, or without it for the embedded LocalCluster (default "
        "$HASHDIST_CLUSTER_KWARGS)", type="json"))
    workers: int | None = field(default=None, metadata=option("embedded cluster: worker count (default 1)"))
    threads: int | None = field(default=None, metadata=option(
        "embedded cluster (or --engine local): threads per worker (default: all cores)"))
    cache: str | bool | None = field(default=None, metadata=option(
        "block result store (default: the per-user cache)"))
    progress: bool = False

    def __post_init__(self):
        if isinstance(self.cache, os.PathLike):
            object.__setattr__(self, "cache", str(self.cache))
        from hashdist.engine.cache import resolve_cache

        resolve_cache(self.cache)  # a directory, or the per-user one ($HASHDIST_CACHE): checked before any run
        for name in ("workers", "threads"):
            value = getattr(self, name)
            if value is not None and (not is_integer(value) or value < 1):
                raise InputError(f"--{name} must be at least 1, got {value}")
        if self.engine not in ("flow", "local"):
            raise InputError(f"--engine must be flow or local, got {self.engine!r}")
        if self.engine == "local":
            self._check_local()
        else:
            self._check_one_cluster()

    def _check_local(self) -> None:
        for name in ("address", "cluster_class", "workers"):
            if getattr(self, name) is not None:
                raise InputError(f"--{name.replace('_', '-')} places the blocks on a cluster: only with the flow "
                                 "engine (--engine local runs threads in this process)")
        if self.cluster_kwargs:
            raise InputError("--cluster-kwargs: only with the flow engine (--engine local runs threads in this "
                             "process)")

    def _check_one_cluster(self) -> None:
        """An existing cluster (address), a per-run one (cluster_class, cluster_kwargs) or the embedded one
        (workers, threads, and cluster_kwargs for its LocalCluster): options of another are refused."""
        given = {name for name in ("address", "cluster_class", "workers", "threads") if getattr(self, name) is not None}
        kwargs = self.cluster_kwargs or {}
        if kwargs:
            given.add("cluster_kwargs")
        for first, second in (("address", "cluster_class"), ("address", "cluster_kwargs"), ("address", "workers"),
                              ("address", "threads"), ("cluster_class", "workers"), ("cluster_class", "threads")):
            if {first, second} <= given:
                raise InputError(f"--{first.replace('_', '-')} and --{second.replace('_', '-')}: options of two "
                                 "different clusters (an existing one, a per-run one, the embedded one); give one")
        for option_name, key in (("workers", "n_workers"), ("threads", "threads_per_worker")):
            if option_name in given and key in kwargs:
                raise InputError(f"--{option_name} and --cluster-kwargs {key}: give one")

    @property
    def cluster(self) -> dict:
        """The cluster's settings as the flows' task runner takes them."""
        return {"address": self.address, "cluster_class": self.cluster_class, "cluster_kwargs": self.cluster_kwargs,
                "workers": self.workers, "threads": self.threads}


def cluster_kwargs_option(text: str | None) -> dict | None:
    """--cluster-kwargs as a dict; None when it gives none, so that $HASHDIST_CLUSTER_KWARGS applies."""
    return (json_object(text, "--cluster-kwargs") or None) if text else None


def split_keywords(function: str, keywords: dict, *classes) -> list[dict]:
    """``keywords`` of a public function split between the options classes that declare them; a keyword none
    declares is a TypeError naming the function and the closest keyword."""
    known = {f.name: i for i, cls in enumerate(classes) for f in fields(cls)}
    parts: list[dict] = [{} for _ in classes]
    for name, value in keywords.items():
        if name not in known:
            close = closest(name, list(known))
            hint = f" (did you mean {close!r}?)" if close else f"; its options: {', '.join(known)}"
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r}{hint}")
        parts[known[name]][name] = value
    return parts


@dataclass(frozen=True, kw_only=True)
class CompareOptions:
    """What ``hashdist compare`` computes: the cut-offs and radii every method is evaluated at, the tests'
    and intervals' resampling, and on datasets with modalities the tasks compared."""

    k: tuple[int, ...] = field(default=DEFAULT_K, metadata=option("cut-offs K (default {default})", type=int,
                                                                  nargs="+"))
    radius: tuple[int, ...] = field(default=DEFAULT_RADII, metadata=option(
        "Hamming radii (default {default}); LGAP and micro F are compared at the largest", type=int, nargs="+"))
    permutations: int = field(default=DEFAULT_PERMUTATIONS, metadata=option(
        "sign-flip permutations per test (default {default})"))
    bootstrap: int = DEFAULT_BOOTSTRAP  # resamples of each bootstrap interval (Python API only)
    seed: int = field(default=DEFAULT_SEED, metadata=option(
        "seed of the randomisation tests and bootstrap (default {default})"))
    tasks: tuple[str, ...] = field(default=(), metadata=option(
        "datasets with modalities: compare on the task QUERY->DATABASE (repeatable), e.g. image->text; default: "
        "the datasets' cross tasks (image->text and text->image), each compared on its own", flag="--task",
        action="append", metavar="A->B"))

    def __post_init__(self):
        object.__setattr__(self, "k", _listed(self.k, "--k / k=", _NUMBER, "a number"))
        object.__setattr__(self, "radius", _listed(self.radius, "--radius / radius=", _NUMBER, "a number"))
        check_integer(self.permutations, "--permutations")
        check_integer(self.bootstrap, "bootstrap=")
        check_integer(self.seed, "--seed", 0)
        # K, radii and tasks checked as evaluate's; the tasks as it normalises them (a→b, spaces: a->b)
        object.__setattr__(self, "tasks", self.evaluate_options.tasks)

    @property
    def evaluate_options(self) -> EvaluateOptions:
        """What each method's datasets (each task's view) are evaluated with."""
        return EvaluateOptions(k=self.k, radius=self.radius, tasks=self.tasks)


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    """What ``hashdist search`` builds and searches: a faiss binary index from its factory string, the k-NN lists
    (``k``) and/or the radius lookup (``radius``, inclusive) of every query, at each setting of the index's one
    search parameter (``nprobe``, ``ef_search`` or ``nflip``; default: faiss's). Checked here without faiss or a
    dataset; :func:`hashdist.served.search.prepare` checks the rest."""

    index: str = field(metadata=option(
        "a faiss binary index factory string: BFlat (exhaustive), BIVF1024 (inverted lists), BHNSW32 (graph), "
        "BHash16 or BHash2x8 (hash tables); docs/served.md", metavar="SPEC"))
    k: int | None = field(default=None, metadata=option(
        "the K nearest database items of each query (faiss's search; -1 pads a short list)", metavar="K"))
    radius: int | None = field(default=None, metadata=option(
        "also (or instead of --k) every database item within Hamming distance r of each query, r inclusive "
        "(faiss's range_search at r + 1, which keeps d < radius)", metavar="r"))
    nprobe: tuple[int, ...] = field(default=(), metadata=option(
        "an IVF index: the inverted lists searched per query, one output per value (e.g. 1 4 16)", type=int,
        nargs="+", metavar="N"))
    ef_search: tuple[int, ...] = field(default=(), metadata=option(
        "an HNSW index: efSearch, the graph search's candidate list, one output per value (e.g. 16 64 256)",
        type=int, nargs="+", metavar="N"))
    nflip: tuple[int, ...] = field(default=(), metadata=option(
        "a hash index (BHash16, BHash2x8): the bits flipped around each query's bucket, one output per value",
        type=int, nargs="+", metavar="N"))
    task: str | None = field(default=None, metadata=option(
        "a dataset with modalities: the task QUERY->DATABASE searched (one), e.g. image->text", metavar="A->B"))
    threads: int | None = field(default=None, metadata=option(
        "faiss's threads (default: faiss's, all cores); the time per query depends on it"))
    train_rows: int | None = field(default=None, metadata=option(
        "database rows an index that needs training (IVF) is trained on, drawn at random with --seed (default: "
        "all up to 256 per inverted list, what faiss's k-means would keep of more)", metavar="N"))
    seed: int = field(default=DEFAULT_SEED, metadata=option("seed of the training rows' draw (default {default})"))

    def __post_init__(self):
        set_ = object.__setattr__
        if not isinstance(self.index, str) or not self.index.strip():
            raise InputError(f"--index must be a faiss binary index factory string such as BIVF1024, got "
                             f"{self.index!r}")
        set_(self, "index", self.index.strip())
        if self.k is None and self.radius is None:
            raise InputError("give --k K (k nearest neighbours) or --radius r (a radius lookup), or both")
        if self.k is not None:
            check_integer(self.k, "--k")
        if self.radius is not None:
            check_integer(self.radius, "--radius", 0)
        given = []
        for name in ("nprobe", "ef_search", "nflip"):
            flag = f"--{name.replace('_', '-')}"
            values = tuple(check_integer(v, flag, 0 if name == "nflip" else 1)
                           for v in _listed(getattr(self, name), f"{flag} / {name}=", _NUMBER, "an integer"))
            if len(set(values)) < len(values):
                raise InputError(f"{flag}: {sorted(v for v in values if values.count(v) > 1)[0]} is given twice")
            set_(self, name, values)
            given += [flag] if values else []
        if len(given) > 1:
            raise InputError(f"{given[0]} and {given[1]}: parameters of different indexes (IVF, HNSW, hash); "
                             "give the one of --index")
        if self.task is not None:
            set_(self, "task", "->".join(parse_task(self.task)))
        for name in ("threads", "train_rows"):
            if getattr(self, name) is not None:
                check_integer(getattr(self, name), f"--{name.replace('_', '-')}")
        check_integer(self.seed, "--seed", 0)

    @property
    def parameter(self) -> tuple[str, tuple[int, ...]] | None:
        """The search parameter given, as (faiss's name, values), or None."""
        for name, faiss_name in (("nprobe", "nprobe"), ("ef_search", "efSearch"), ("nflip", "nflip")):
            if getattr(self, name):
                return faiss_name, getattr(self, name)
        return None


def closest(word: str, known: list[str]) -> str | None:
    """The known name a typo most likely meant: the closest by spelling, else one the word contains or
    is contained in (``topk`` -> ``k``, ``radii`` -> ``radius``), else None."""
    word = word.lower()
    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    if close:
        return close[0]
    inside = [name for name in known if name in word or word in name]
    return max(inside, key=len) if inside else None


@dataclass(frozen=True, kw_only=True)
class GroundTruthOptions:
    """What ``hashdist groundtruth`` computes from the dataset's features: an epsilon ball (given, or estimated
    from a sample's ``neighbors``-th nearest item) or the top ``percent`` of the database per query."""

    method: Literal["epsilon_ball", "top_percent"] = field(metadata=option(
        "epsilon_ball: distance <= epsilon; top_percent: the --percent nearest"))
    neighbors: int | None = field(default=None, metadata=option(
        f"epsilon_ball: the R-th neighbour sets epsilon (default {GROUNDTRUTH_NEIGHBORS})"))
    sample: int | None = field(default=None, metadata=option(
        f"epsilon_ball: database points sampled for epsilon (default {GROUNDTRUTH_SAMPLE})"))
    seed: int | None = field(default=None, metadata=option("epsilon_ball: seed of the sample (default 0)"))
    epsilon: float | None = field(default=None, metadata=option(
        "epsilon_ball: use this radius instead of estimating it"))
    percent: float | None = field(default=None, metadata=option(
        f"top_percent: percentage of the database (default {GROUNDTRUTH_PERCENT:g})"))
    query_block_rows: int | None = field(default=None, metadata=option(
        f"queries per block (default {GROUNDTRUTH_QUERY_BLOCK_ROWS}; rounded up to whole chunks)"))
    db_block_rows: int | None = field(default=None, metadata=option(
        f"database rows per block (default {DEFAULT_DB_BLOCK_ROWS}; rounded up to whole chunks; at most 2^31 - 1)"))

    def __post_init__(self):
        methods = typing.get_args(typing.get_type_hints(GroundTruthOptions)["method"])
        if self.method not in methods:
            raise InputError(f"--method must be one of {', '.join(methods)}, got {self.method!r}")
        if self.method == "top_percent":
            _refuse(((self.neighbors, "--neighbors"), (self.sample, "--sample"), (self.seed, "--seed"),
                     (self.epsilon, "--epsilon")), "applies only to --method epsilon_ball")
            percent = GROUNDTRUTH_PERCENT if self.percent is None else check_number(self.percent, "--percent")
            if not 0 < percent <= 100:
                raise InputError(f"--percent must be in (0, 100], got {percent:g}")
            return
        if self.percent is not None:
            raise InputError("--percent applies only to --method top_percent")
        if self.epsilon is not None:
            _refuse(((self.neighbors, "--neighbors"), (self.sample, "--sample"), (self.seed, "--seed")),
                    "sets how epsilon is estimated; it cannot be combined with --epsilon")
            if check_number(self.epsilon, "--epsilon") < 0:
                raise InputError(f"--epsilon must be >= 0, got {self.epsilon:g}")

    def resolve(self, dataset) -> tuple:
        """Open the dataset, check its features and the options against its sizes: the checked request
        (dataset, hashdist.engine.groundtruth.Params)."""
        from hashdist.engine import groundtruth as gt  # numba functions of its own: loaded by ground truth alone

        ds = open_dataset(dataset)
        gt.check_features(ds)
        blocks = dict(
            query_block_rows=block_rows(self.query_block_rows, ds.chunk_rows("queries"), GROUNDTRUTH_QUERY_BLOCK_ROWS,
                                        "--query-block-rows", ds.n_queries),
            db_block_rows=block_rows(self.db_block_rows, ds.chunk_rows("database"), DEFAULT_DB_BLOCK_ROWS,
                                     "--db-block-rows", ds.n_database))
        if self.method == "top_percent":
            percent = GROUNDTRUTH_PERCENT if self.percent is None else float(self.percent)
            return ds, gt.Params(self.method, percent=percent, **blocks)
        if self.epsilon is not None:
            return ds, gt.Params(self.method, epsilon=float(self.epsilon), **blocks)
        estimate = gt.epsilon_estimate(ds.n_database, self.neighbors, self.sample, self.seed)
        return ds, gt.Params(self.method, **estimate, **blocks)


def _refuse(options, why: str) -> None:
    """InputError naming the first of the (value, option) pairs that is given, and ``why`` it does not apply."""
    for value, name in options:
        if value is not None:
            raise InputError(f"{name} {why}")
