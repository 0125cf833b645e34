"""What the flows share: Prefect defaults and task options, the Dask task runner, CLI plumbing."""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import math
import os
import signal
import socket
import threading
import uuid


def set_prefect_defaults() -> None:
    """hashdist's defaults for Prefect settings, before Prefect loads them; the environment still wins.

    No telemetry, server or client, unless the environment asks for it (it fails without network and logs an
    ERROR on every run), and time for the
    temporary API server to start on a loaded machine (Prefect's default limit is 20 s).
    """
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")  # Prefect's client telemetry (and its first-run notice) listens to this
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")


set_prefect_defaults()

from prefect.cache_policies import NO_CACHE  # noqa: E402
from prefect.context import FlowRunContext, refresh_global_settings_context  # noqa: E402
from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings  # noqa: E402
from prefect_dask import DaskTaskRunner  # noqa: E402

from flows.apiserver import TemporaryAPIServer  # noqa: E402
from flows.observe import RECORD_MARK  # noqa: E402
from hashdist.errors import InputError, json_object  # noqa: E402


def cache_parameter(cache) -> str | bool | None:
    """A ``cache`` argument as a flow parameter (JSON): None, True or False as given, a directory as a string;
    the flow resolves it (:func:`hashdist.engine.cache.resolve_cache`) where it runs."""
    return cache if cache is None or isinstance(cache, bool) else str(cache)


def retry_unless_bad_input(task, task_run, state) -> bool:
    """Prefect's ``retry_condition_fn``: retry transient faults, never bad input (it would fail again)."""
    return not isinstance(state.data, InputError)


# Results travel through Dask, never through Prefect's result storage: no caching,
# no persistence. Retries cover transient worker faults.
TASK_OPTIONS = dict(cache_policy=NO_CACHE, persist_result=False, retries=2, retry_delay_seconds=1,
                    retry_condition_fn=retry_unless_bad_input)


def cluster_threads() -> int:
    """Worker threads of the flow's Dask cluster (at least 1), counting workers a per-run cluster has asked for.

    A batch system's workers (dask-jobqueue's SLURMCluster: one job each) join only when their jobs start,
    usually after the flow has split its work: counting only the workers already there would make one share
    (none there) and leave every later job idle. So for a cluster with a plan of workers, wait for the first
    to join and count each planned worker with its threads.
    """
    client = FlowRunContext.get().task_runner.client
    threads = client.nthreads()
    planned = len(getattr(client.cluster, "plan", None) or ())  # a SpecCluster's workers, joined or not
    if planned > len(threads):
        timeout = worker_timeout()
        try:
            client.wait_for_workers(1, timeout=timeout)
        except TimeoutError:
            raise InputError(f"no worker of the cluster started within {timeout:g} s (its jobs pending or refused: "
                             "see the batch system's queue and the jobs' logs; $HASHDIST_WORKER_TIMEOUT sets the "
                             "wait)") from None
        threads = client.nthreads()
        return max(1, sum(threads.values()), planned * max(threads.values(), default=1))
    return max(1, sum(threads.values()))


def workers_in_this_process() -> bool:
    """Whether the flow's Dask workers are threads of this process (the embedded LocalCluster): then they share
    its compiled functions and its numba cache."""
    workers = FlowRunContext.get().task_runner.client.scheduler_info(n_workers=-1)["workers"]
    return bool(workers) and all(address.startswith("inproc://") for address in workers)


def worker_timeout() -> float:
    """$HASHDIST_WORKER_TIMEOUT: seconds a run waits for the first worker of a per-run cluster (default 1 h)."""
    text = os.environ.get("HASHDIST_WORKER_TIMEOUT", "3600")
    try:
        timeout = float(text)
    except ValueError:
        timeout = math.nan
    if not timeout > 0 or math.isinf(timeout):
        raise InputError(f"$HASHDIST_WORKER_TIMEOUT must be a positive number of seconds, not {text!r}")
    return timeout


def check_scheduler(address: str, source: str = "--address") -> None:
    """Refuse, in one line, a scheduler address of a scheme Dask does not know or that cannot reach another
    process (inproc://), and a tcp:// or tls:// one where nothing listens (distributed would retry for 30 s and
    fail with a traceback); ``source`` names where the address came from."""
    from distributed.comm import parse_address, parse_host_port
    from distributed.comm.registry import get_backend

    try:
        protocol, location = parse_address(address)
        get_backend(protocol)
        if protocol == "inproc":
            raise ValueError("inproc:// reaches only a scheduler in this process")
        if protocol not in ("tcp", "tls"):
            return
        host, port = parse_host_port(location)
    except ValueError as exc:
        raise InputError(f"{source}: Dask scheduler address {address!r} is malformed ({exc})") from None
    try:
        socket.create_connection((host, port), timeout=10).close()
    except OSError as exc:
        raise InputError(f"{source}: no Dask scheduler answers at {address} ({exc.strerror or exc})") from None


def check_cluster_class(name: str, source: str = "--cluster-class") -> None:
    """Refuse, in one line, a cluster class that is not an importable ``module.Class`` (Dask would fail the run
    with an import traceback); ``source`` names where the value came from."""
    module, _, attribute = name.rpartition(".")
    if not module or not attribute:
        raise InputError(f"{source} {name!r}: not a dotted path module.Class (e.g. dask_jobqueue.SLURMCluster)")
    try:
        found = getattr(importlib.import_module(module), attribute, None)
    except ImportError as exc:
        raise InputError(f"{source} {name}: cannot import {module} ({exc})") from None
    if not callable(found):
        raise InputError(f"{source} {name}: {module} has no class {attribute}")


def check_api(url: str) -> None:
    """Refuse, in one line, a Prefect API URL where nothing answers (Prefect would fail the run with a long
    traceback); any HTTP answer will do."""
    import httpx

    try:
        httpx.get(f"{url.rstrip('/')}/health", timeout=10)
    except httpx.HTTPError as exc:
        raise InputError(f"PREFECT_API_URL {url}: no Prefect API answers ({type(exc).__name__}: {exc})") from None


def environment_cluster_kwargs() -> dict | None:
    """$HASHDIST_CLUSTER_KWARGS (a JSON object), None when unset; a malformed value is an InputError."""
    text = os.environ.get("HASHDIST_CLUSTER_KWARGS")
    return json_object(text, "$HASHDIST_CLUSTER_KWARGS") if text else None


@contextlib.contextmanager
def _sigint_kept():
    """SIGINT's handler as it was before: importing dask-jobqueue 0.9.0 sets it to ``sys.exit()``, so Ctrl-C
    would end an interrupted run with exit status 0 (dask/dask-jobqueue#696, fixed after 0.9.0)."""
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGINT) if main else None
    try:
        yield
    finally:
        if handler is not None and signal.getsignal(signal.SIGINT) is not handler:
            signal.signal(signal.SIGINT, handler)


def _settle(address, cluster_class, cluster_kwargs, workers, threads) -> DaskTaskRunner:
    """The runner these arguments describe, unset ones taken from $HASHDIST_* now."""
    address_source = "--address" if address else "$HASHDIST_DASK_ADDRESS"
    address = address or os.environ.get("HASHDIST_DASK_ADDRESS")
    arguments_class = cluster_class
    cluster_class = cluster_class or os.environ.get("HASHDIST_CLUSTER_CLASS")
    if cluster_kwargs is None:
        cluster_kwargs = environment_cluster_kwargs()
    if address:
        check_scheduler(address, address_source)
        return DaskTaskRunner(address=address)
    if cluster_class:
        check_cluster_class(cluster_class, "--cluster-class" if arguments_class else "$HASHDIST_CLUSTER_CLASS")
        worker_timeout()  # a malformed value fails the run now, not when it first waits for a worker
        with _sigint_kept():  # the runner imports the cluster class's module
            return DaskTaskRunner(cluster_class=cluster_class, cluster_kwargs=cluster_kwargs or {})
    return DaskTaskRunner(cluster_kwargs={**embedded_cluster_kwargs(workers, threads), **(cluster_kwargs or {})})


# `dask scheduler` / `dask worker` options that keep every server on 127.0.0.1: --host places the comm port,
# and the HTTP server (health, metrics) that runs even with --no-dashboard listens on --dashboard-address, which
# otherwise means every interface
LOOPBACK_DASK_ARGS = ("--host", "127.0.0.1", "--no-dashboard", "--dashboard-address", "127.0.0.1:0")


def embedded_cluster_kwargs(workers=None, threads=None) -> dict:
    """``LocalCluster`` arguments of the embedded default: workers of threads (the kernels release the GIL, and
    a thread worker needs no Prefect server of its own); no dashboard, and the scheduler's and the worker's HTTP
    servers on free loopback ports (8787 may be another cluster's; an in-process worker's HTTP server otherwise
    listens on every interface)."""
    return {"n_workers": workers or 1, "threads_per_worker": threads or os.cpu_count() or 1, "processes": False,
            "dashboard_address": None, "scheduler_kwargs": {"dashboard_address": "127.0.0.1:0"},
            "worker_dashboard_address": "127.0.0.1:0"}


class EnvironmentTaskRunner(DaskTaskRunner):
    """A DaskTaskRunner that settles its cluster inside the flow run, when the flow first needs it.

    So a malformed $HASHDIST_* variable fails that run (Prefect marks it Failed, naming the
    variable), never the import of the flow's module, whose decorator builds its default runner.
    """

    def __init__(self, address=None, cluster_class=None, cluster_kwargs=None, workers=None, threads=None):
        super().__init__()
        self.arguments = dict(address=address, cluster_class=cluster_class, cluster_kwargs=cluster_kwargs,
                              workers=workers, threads=threads)

    def duplicate(self) -> EnvironmentTaskRunner:
        return type(self)(**self.arguments)

    @property
    def client(self):
        if not self._client:
            settled = _settle(**self.arguments)
            self.address, self.cluster_class = settled.address, settled.cluster_class
            self.resolved_cluster_class, self.cluster_kwargs = settled.resolved_cluster_class, settled.cluster_kwargs
            if not self.address:  # a cluster this run creates: its options are the user's (or a deployment's)
                return self._started_cluster_client()
        return super().client

    def _started_cluster_client(self):
        """The client of the cluster this run creates; one line naming its options and the first error if it
        does not start. A worker process that fails to start has the error logged in the worker and by its
        nanny here, then the cluster raises only that the nanny failed: the nanny's record names the cause."""
        shown = dict(self.cluster_kwargs)
        if not CLUSTER_LOGS_SHOWN and self.cluster_class in (None, "distributed.LocalCluster", "LocalCluster"):
            # the command line's one-line errors: no Dask log lines, in this process or the workers'
            self.cluster_kwargs = {"silence_logs": logging.CRITICAL, **self.cluster_kwargs}
        errors = _ErrorsHeld()
        nanny = logging.getLogger("distributed.nanny")
        nanny.addFilter(errors)
        try:
            return super().client
        except Exception as exc:
            cause = errors.first or exc
            cluster = self.cluster_class if isinstance(self.cluster_class, str) else "LocalCluster"
            raise InputError(f"the Dask cluster did not start ({cluster} with keyword arguments "
                             f"{json.dumps(shown, default=str)}): {type(cause).__name__}: {cause}") from None
        finally:
            nanny.removeFilter(errors)


# whether a cluster the flow creates prints Dask's log lines: the command line turns them off unless --debug
CLUSTER_LOGS_SHOWN = True


class _ErrorsHeld(logging.Filter):
    """Keeps the first exception logged by a Dask logger (the record still goes to its handlers)."""

    first: BaseException | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if self.first is None and record.exc_info and record.exc_info[1] is not None:
            self.first = record.exc_info[1]
        return True


_WORKERS_API: TemporaryAPIServer | None = None  # see api_for_workers


@contextlib.contextmanager
def api_for_workers(address=None, cluster_class=None, cluster_kwargs=None):
    """For a flow run started from Python: a Prefect API that its workers in other processes can report to.

    With $PREFECT_API_URL set, that one; on workers in this process, Prefect's own temporary server in this
    process. Workers elsewhere (``address``, ``cluster_class``, their $HASHDIST_* variables, or worker processes
    through ``cluster_kwargs``) cannot reach that one, and each would start a server of its own that stays with
    the worker: they get hashdist's temporary server (flows.apiserver), started at the first such run and
    ended with this process, as Prefect's own. (The command line starts that server itself.)"""
    global _WORKERS_API
    kwargs = cluster_kwargs if cluster_kwargs is not None else environment_cluster_kwargs() or {}
    elsewhere = (address or cluster_class or os.environ.get("HASHDIST_DASK_ADDRESS")
                 or os.environ.get("HASHDIST_CLUSTER_CLASS") or kwargs.get("processes"))
    if PREFECT_API_URL.value() or not elsewhere:
        yield
        return
    if _WORKERS_API is None or _WORKERS_API.process.poll() is not None:
        _WORKERS_API = TemporaryAPIServer()
    with temporary_settings(updates={PREFECT_API_URL: _WORKERS_API.api_url}):
        yield


def runner_where(runner) -> str:
    """Where a flow run's blocks run, for its work line: its runner's cluster, unset arguments from $HASHDIST_*."""
    from hashdist.report.tasks import where_blocks_run

    arguments = getattr(runner, "arguments", None) or {"address": getattr(runner, "address", None),
                                                       "cluster_class": getattr(runner, "cluster_class", None)}
    cluster_class = arguments["cluster_class"] or os.environ.get("HASHDIST_CLUSTER_CLASS")
    return where_blocks_run("flow", arguments["address"] or os.environ.get("HASHDIST_DASK_ADDRESS"),
                            cluster_class if isinstance(cluster_class, str) or cluster_class is None
                            else f"{cluster_class.__module__}.{cluster_class.__name__}")


def task_runner(address=None, cluster_class=None, cluster_kwargs=None, workers=None, threads=None) -> DaskTaskRunner:
    """An existing cluster (address), a per-run cluster (cluster_class), or the embedded LocalCluster of threads.

    Unset arguments fall back to $HASHDIST_DASK_ADDRESS, $HASHDIST_CLUSTER_CLASS and
    $HASHDIST_CLUSTER_KWARGS (JSON), read when the run starts: that is how a deployed,
    scheduled run finds its cluster.
    """
    return EnvironmentTaskRunner(address, cluster_class, cluster_kwargs, workers, threads)


class _DropHashdistRecords(logging.Filter):
    """Drops hashdist's own run-log records (flows.observe): the CLI prints its own lines; they still reach the API."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, RECORD_MARK, False)


class _DropBadInput(logging.Filter):
    """Drops Prefect's records about an InputError: the CLI reports bad input in one line of its own."""

    # how a failed run's final state names its exception (prefect.states.exception_to_failed_state)
    STATE_MESSAGE = f"exception {InputError.__name__}: "

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], InputError):
            return False
        message = record.getMessage()
        if record.name.startswith("prefect.task_runner") and message.startswith("Failed to create"):
            return False  # a cluster that did not start: EnvironmentTaskRunner.client reports it in one line
        # at exit, Prefect's event worker may still be sending a failed run's events to a busy server
        return self.STATE_MESSAGE not in message and not message.startswith("Still processing items")


def _load_while_waiting(plots: bool) -> None:
    """What the run would load later anyway, loaded in a thread of its own while the flow run starts, when the
    CLI's thread mostly waits for the API server (booting, then answering the run's first requests); in the
    order the run needs them, and only what it needs.

    FastAPI's encoders (about 0.5 s: Prefect encodes the flow's parameters with them when it creates
    the flow run), numba's compiler (about 0.4 s before the first kernel call; then kernels load from
    numba's cache), and for a run that draws the report's plots, matplotlib (about 0.5 s).
    """
    import fastapi.encoders  # noqa: F401
    import numba

    numba.njit(lambda: 0)()
    if plots:
        import matplotlib.pyplot  # noqa: F401


@contextlib.contextmanager
def cli_run(debug: bool, server: TemporaryAPIServer | None = None, plots: bool = True):
    """The command line's flow run: bad input is reported before the run starts, in one line of the CLI's own.

    Checks $HASHDIST_CLUSTER_KWARGS; runs on ``server`` (the CLI's temporary API server) unless
    Prefect's settings name an API (then stops it); keeps hashdist's run-log records off the console (the CLI
    prints its own lines) and, unless ``debug``, Prefect's records about bad input. ``plots``: whether the run
    draws plots.
    """
    environment_cluster_kwargs()
    with contextlib.ExitStack() as stack:
        if PREFECT_API_URL.value():
            if server is not None:
                server.stop()
            check_api(PREFECT_API_URL.value())
        elif server is not None:
            # for the rest of the process, as Prefect's own temporary server: every thread, and processes it starts
            os.environ["PREFECT_API_URL"] = server.api_url
            refresh_global_settings_context()
            # no flow run heartbeats: nothing watches a temporary server's runs, and the engine waits up to 1 s
            # at the end of a run for the heartbeat thread
            stack.enter_context(temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}))
            threading.Thread(target=_load_while_waiting, args=(plots,), name="hashdist-preload", daemon=True).start()
        # Prefect's logging, set up once: importing prefect.main sets it up, as the flow module's `from prefect
        # import flow` would anyway (Prefect's ensure_logging_setup() first would make that a second set-up: the
        # logging configuration's template filled from every setting again, 0.06 s)
        import prefect.main  # noqa: F401

        drops = [_DropHashdistRecords()]
        if not debug:
            global CLUSTER_LOGS_SHOWN
            CLUSTER_LOGS_SHOWN = False
            drops.append(_DropBadInput())
        for handler in logging.getLogger().handlers:  # kept until the process exits, as Prefect's exit logs
            for drop in drops:
                handler.addFilter(drop)
        yield


_HANDED: dict[str, object] = {}  # what a caller checked, for the flow run it starts in this process


@contextlib.contextmanager
def handed_over(value):
    """A key (a flow parameter) under which a flow run in this process takes ``value``, already checked, instead
    of checking its inputs again; a run elsewhere (a deployment) gets no value and checks them itself."""
    key = uuid.uuid4().hex
    _HANDED[key] = value
    try:
        yield key
    finally:
        _HANDED.pop(key, None)


def taken(key: str | None):
    """The value handed over under ``key`` (see :func:`handed_over`), or None."""
    return _HANDED.pop(key, None) if key else None
