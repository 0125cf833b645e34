"""Shared fixtures: small on-disk datasets with heavy ties, and one Prefect test API for the session."""

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent  # the repository

# keep test runs quiet and self-contained
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")


def write_inputs(directory, *, n_db=3000, n_q=70, nbits=12, kind="class", seed=0, n_classes=4, n_concepts=6):
    """Random code/label .npy files with heavy ties (few bits, few classes); returns their paths."""
    rng = np.random.default_rng(seed)
    paths = {}
    db = rng.integers(0, 2, (n_db, nbits)).astype(np.int8) * 2 - 1  # {-1,+1}
    q = rng.integers(0, 2, (n_q, nbits)).astype(np.uint8)  # {0,1}
    if kind == "class":
        dbl, ql = rng.integers(0, n_classes, n_db), rng.integers(0, n_classes, n_q)
    else:
        dbl = (rng.random((n_db, n_concepts)) < 0.25).astype(np.uint8)
        ql = (rng.random((n_q, n_concepts)) < 0.25).astype(np.uint8)
    for name, arr in (("db", db), ("q", q), ("dbl", dbl), ("ql", ql)):
        paths[name] = str(directory / f"{name}.npy")
        np.save(paths[name], arr)
    return paths


@pytest.fixture
def files(tmp_path):
    """Small class-labelled inputs (.npy files) for ingest: 200 database items, 10 queries, 8 bits."""
    return write_inputs(tmp_path, n_db=200, n_q=10, nbits=8)


def ingest_argv(files, out, **override):
    """`hashdist ingest` of ``files`` into ``out``; ``override`` replaces options (None drops one)."""
    args = {"--db-codes": files["db"], "--query-codes": files["q"], "--db-labels": files["dbl"],
            "--query-labels": files["ql"], **override}
    return [str(a) for a in ["ingest", "--out", out, *[x for k, v in args.items() if v is not None for x in (k, v)]]]


def assert_refused(capsys, argv, needle, not_created=None) -> str:
    """The CLI exits with status 2 and one line containing ``needle`` (returned), no traceback; ``not_created``
    is not written, not even as a staged temporary sibling."""
    from hashdist.cli import main

    capsys.readouterr()
    status = main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert needle in lines[0], lines[0]
    if not_created is not None:
        assert not not_created.exists()
        assert not list(not_created.parent.glob(f".{not_created.name}.tmp-*"))
    return lines[0]


def make_dataset(directory, name="data.zarr", chunk_rows=500, query_chunk_rows=16, **kw):
    from hashdist.data.ingest import ingest

    p = write_inputs(directory, **kw)
    out = directory / name
    ingest(out, p["db"], p["q"], db_labels=p["dbl"], query_labels=p["ql"], chunk_rows=chunk_rows,
           query_chunk_rows=query_chunk_rows)
    return str(out)


@pytest.fixture(scope="session")
def class_dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("class"))


@pytest.fixture(scope="session")
def multilabel_dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("multilabel"), kind="multilabel", nbits=65, seed=1)


@pytest.fixture(scope="session")
def prefect_api():
    """A temporary Prefect API server for the whole session (prefect_test_harness)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def prefect_server(tmp_path):
    """A real `prefect server` on 127.0.0.1 for the test: the environment that reaches it."""
    with running_prefect_server(tmp_path) as env:
        yield env


@contextlib.contextmanager
def running_prefect_server(directory: Path):
    """A real `prefect server` on 127.0.0.1 (its PREFECT_HOME and log in ``directory``), stopped at the end; yields
    the environment that reaches it."""
    import httpx

    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(directory / "prefect-home"),
           "PREFECT_API_URL": f"http://127.0.0.1:{port}/api", "PREFECT_LOGGING_LEVEL": "WARNING",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    log = open(directory / "server.log", "w")
    server = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                              env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None, (directory / "server.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "prefect server did not become healthy in 120 s"
            time.sleep(0.5)
        yield env
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def listening_sockets(pid: int) -> set[tuple[str, int]]:
    """The (address, port) pairs process ``pid`` and its descendants listen on (TCP); empty once it has exited."""
    import psutil

    sockets = set()
    try:
        process = psutil.Process(pid)
        tree = [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:
        return sockets
    for proc in tree:
        try:
            sockets |= {c.laddr[:2] for c in proc.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}
        except psutil.Error:
            pass
    return sockets


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def loopback_cluster():
    """`dask scheduler` and two `dask worker` processes on 127.0.0.1, reaching the test Prefect API."""
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_LOGGING_LEVEL": "WARNING"}
    with loopback_dask(env) as cluster:
        yield cluster


@contextlib.contextmanager
def loopback_dask(env: dict):
    """(address, processes) of a `dask scheduler` and two `dask worker` processes on 127.0.0.1 started with
    ``env`` (the Prefect API their task runs report to); all stopped at the end."""
    from flows.runtime import LOOPBACK_DASK_ARGS

    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    procs = [subprocess.Popen([str(BIN / "dask"), "scheduler", *LOOPBACK_DASK_ARGS, "--port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        for _ in range(2):
            procs.append(subprocess.Popen([str(BIN / "dask"), "worker", address, *LOOPBACK_DASK_ARGS,
                                           "--nthreads", "1"], env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        from distributed import Client

        deadline = time.monotonic() + 60
        while True:
            try:
                with Client(address, timeout=5) as client:
                    client.wait_for_workers(2, timeout=60)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        yield address, procs
    finally:
        for p in procs[::-1]:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


@contextlib.contextmanager
def lock_held_elsewhere(target):
    """Another process holds hashdist's output lock on ``target`` for the duration."""
    code = ("import sys\nfrom hashdist.data.atomic import exclusive\n"
            f"with exclusive({str(target)!r}):\n    print('held', flush=True)\n    sys.stdin.read()\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.stdin.close()
        try:
            holder.wait(timeout=30)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()


@pytest.fixture
def cli_env(tmp_path):
    """The CLI's environment: Prefect's temporary API server (no PREFECT_API_URL), an empty block cache."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "HASHDIST_CLUSTER_KWARGS")}
    return {**env, "HASHDIST_CACHE": str(tmp_path / "cache")}
