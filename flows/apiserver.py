"""The command line's temporary Prefect API server: started before Prefect loads, gone with the process.

Only the standard library at import, so the CLI starts the server first thing and it boots
(about 3 s of imports and app set-up) while the CLI imports Prefect and Dask. The CLI binds
the server's loopback socket and hands it over: it listens from the start, so Prefect's first
request waits in the backlog until the server is up, and no other process can take the port. As it
starts, the server also sends itself a few read-only requests: what it sets up lazily at its first
requests (0.3 to 0.4 s) is then ready when the run's requests arrive, if they come later.
The server's database lives in a temporary directory that goes with the server: a copy of a
migrated template kept per user and Prefect version (migrating a new database takes about 8 s).

``hashdist.cli.launch`` (the ``hashdist`` console script) starts the server before ``hashdist`` itself
loads (about 0.5 s of numpy, numba and zarr) when the command line asks for a flow run.
"""

from __future__ import annotations

import atexit
import gc
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# Prefect's settings for the server process, over the environment: a database of its own, already
# migrated and with Prefect's block types; no block registration check at start (it would hash every
# block type and rewrite Prefect's memo store, for a database that never outlives the run); no UI.
# PREFECT__SERVER_EPHEMERAL runs only the services Prefect's own temporary server runs, and of those none:
# they record the events a run sends (its task runs, for the UI) and act on them (automations, streams to
# subscribers), and nothing reads a database that goes with the run; the API itself still answers everything.
SERVER_SETTINGS = {"PREFECT_SERVER_DATABASE_MIGRATE_ON_START": "false",
                   "PREFECT_SERVER_REGISTER_BLOCKS_ON_START": "false",
                   "PREFECT_MEMOIZE_BLOCK_AUTO_REGISTRATION": "false",
                   "PREFECT_UI_ENABLED": "false", "PREFECT__SERVER_EPHEMERAL": "1",
                   "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED": "false",
                   "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED": "false",
                   "PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "false",
                   "PREFECT_API_EVENTS_STREAM_OUT_ENABLED": "false"}

# the server's settings unless the environment gives them: no usage data sent or announced, no beartype
SERVER_DEFAULTS = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1",
                   "PY_KEY_VALUE_DISABLE_BEARTYPE": "true"}


# What hashdist uses of Prefect beyond its public flow/task API, and what for: the one list to check when Prefect
# is upgraded (tests/test_prefect_internals.py names the Prefect version and the missing piece).
PREFECT_INTERNALS = (
    ("prefect.server.api.server", "create_app", "the temporary API server's app (serve)"),
    ("prefect.server.api.server", "API_ROUTERS", "only the routers a flow run calls (_only_flow_run_routers)"),
    ("prefect.server.utilities.server", "PrefectRouter", "routes built only for the routers kept"),
    ("prefect.server.database", "provide_database_interface", "the migrated template database (_migrate)"),
    ("prefect.server.models.block_registration", "run_block_auto_registration", "block types in the template"),
    ("prefect.settings", "Settings", "one app cache key (_one_app_cache_key)"),
    ("prefect.settings", "temporary_settings", "the run's API URL (flows.runtime)"),
    ("prefect.settings", "PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "flows.runtime's settings"),
    ("prefect.context", "refresh_global_settings_context", "settings changed after Prefect loaded (flows.runtime)"),
    ("prefect.context", "FlowRunContext", "the flow's Dask client (flows.evaluate)"),
    ("prefect.states", "State", "a task run's final state held by Dask (flows.evaluate)"),
    ("prefect_dask", "DaskTaskRunner", "the task runner of every flow (flows.runtime)"),
)


class TemporaryAPIServer:
    """A Prefect API server process for this process: ends with it, even when this one is killed."""

    def __init__(self):
        self.directory = tempfile.mkdtemp(prefix="hashdist-prefect-")
        database = Path(self.directory) / "prefect.db"
        # unless the environment says otherwise: no telemetry (as flows.runtime.set_prefect_defaults; DO_NOT_TRACK
        # also keeps Prefect's import in the server from printing its first-run usage-data notice to a terminal),
        # and no beartype instrumentation of py-key-value (docket's store), whose modules are then compiled afresh
        # at every start where Python writes no bytecode cache (about 0.1 s)
        env = {**SERVER_DEFAULTS, **os.environ,
               **SERVER_SETTINGS,
               "PREFECT_SERVER_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{database}"}
        with socket.create_server(("127.0.0.1", 0), backlog=128) as sock:
            self.api_url = f"http://127.0.0.1:{sock.getsockname()[1]}/api"
            args = [sys.executable, "-c", "from flows.apiserver import serve; serve()", str(os.getpid()),
                    str(sock.fileno()), self.directory]
            # a session of its own: a terminal's Ctrl-C goes to the CLI, which then stops the server
            self.process = subprocess.Popen(args, env=env, pass_fds=[sock.fileno()], start_new_session=True)
        # atexit runs after Prefect's log and event workers have sent what they hold
        atexit.register(self.stop)

    def stop(self) -> None:
        """Ends the server and removes its database."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def template_path() -> Path:
    """The migrated database that servers copy: $XDG_CACHE_HOME/hashdist (~/.cache/hashdist), per Prefect version."""
    from importlib.metadata import version

    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hashdist" / f"prefect-{version('prefect')}.db"


def _migrate(database: Path, template: Path) -> None:
    """Migrates ``database`` (new) and registers Prefect's block types in it, as a server's first start
    would; then keeps a copy as ``template`` (best effort: a read-only cache only costs the next run 8 s)."""
    import asyncio
    import sqlite3

    from prefect.server.database import provide_database_interface
    from prefect.server.models.block_registration import run_block_auto_registration

    async def migrate():
        db = provide_database_interface()
        await db.create_db()
        async with await db.session() as session:
            await run_block_auto_registration(session=session)
        await (await db.engine()).dispose()

    asyncio.run(migrate())
    partial = template.with_name(f"{template.name}.{os.getpid()}")
    try:
        template.parent.mkdir(parents=True, exist_ok=True)
        with sqlite3.connect(database) as source, sqlite3.connect(partial) as copy:
            source.backup(copy)
        os.replace(partial, template)  # whole or not at all, whichever concurrent run gets there last
    except (OSError, sqlite3.Error):
        partial.unlink(missing_ok=True)


def serve() -> None:
    """The server process; ``sys.argv``: the CLI's pid, the listening socket's descriptor, the server's directory."""
    gc.disable()  # importing Prefect's server makes no garbage, only work for the collector (about 0.3 s)
    parent, fd, directory = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

    def exit_with_parent():
        while os.getppid() == parent:
            time.sleep(0.2)
        shutil.rmtree(directory, ignore_errors=True)
        os._exit(1)

    threading.Thread(target=exit_with_parent, daemon=True).start()
    database, template = Path(directory) / "prefect.db", template_path()
    if template.exists():
        shutil.copyfile(template, database)
    else:
        _migrate(database, template)
    import uvicorn

    config = uvicorn.Config("prefect.server.api.server:create_app", factory=True, lifespan="on", log_level="error")
    _only_flow_run_routers()
    _one_app_cache_key()
    config.load()  # creates the app
    gc.freeze()
    gc.enable()
    listening = socket.socket(fileno=fd)
    threading.Thread(target=_warm_up, args=(listening.getsockname()[1],), daemon=True).start()
    uvicorn.Server(config).run(sockets=[listening])


# the API's routers whose routes a flow run calls (flows.evaluate, compare, groundtruth, history: the run, its
# states and task runs, logs, events, artifacts, concurrency slots of tagged tasks) and those the client and the
# warm-up call (admin, csrf_token, root); Prefect's server also serves deployments, work pools, blocks, automations,
# variables and its UI's queries, which a temporary server's single run never uses. In the order of a run's first
# requests: a request matches the routers in turn, and FastAPI builds a router's routes when a request first
# reaches it, so the first requests (the version, the flow, the run) build only the routers they need.
FLOW_RUN_ROUTERS = ("admin", "csrf_token", "flows", "flow_runs", "artifacts", "events", "logs", "task_runs",
                    "flow_run_states", "task_run_states", "concurrency_limits", "concurrency_limits_v2", "root")


def _only_flow_run_routers() -> None:
    """Imports Prefect's server and leaves in its app only the routers a flow run calls, in FLOW_RUN_ROUTERS's
    order, with only their routes built. Each route costs the server's start: FastAPI builds its models as
    its module declares it (0.2 s for all 184 routes), then again when a request first reaches its router
    (with every router, 0.3 to 0.4 s more before the first answer). So while the API's modules load, a route
    is only noted as declared, and it is built when its router is kept."""
    from prefect.server.utilities.server import PrefectRouter

    declared: dict[int, list] = {}
    build = PrefectRouter.add_api_route
    PrefectRouter.add_api_route = lambda self, path, endpoint, **kwargs: declared.setdefault(id(self), []).append(
        (path, endpoint, kwargs))
    try:
        import prefect.server.api as api
        import prefect.server.api.server as server
    finally:
        PrefectRouter.add_api_route = build
    routers = {id(router): router for router in server.API_ROUTERS}
    server.API_ROUTERS = tuple(routers[id(getattr(api, name).router)] for name in FLOW_RUN_ROUTERS)
    for router in server.API_ROUTERS:
        for path, endpoint, kwargs in declared.get(id(router), ()):
            router.add_api_route(path, endpoint, **kwargs)


def _one_app_cache_key() -> None:
    """Prefect keys its caches of apps by a hash of every setting, which serializes them all (0.05 s, twice as
    the app is created); this process creates one app, with settings that do not change, so one key serves."""
    from prefect.settings import Settings

    Settings.hash_key = lambda self: "hashdist-temporary-server"


# read-only requests that make a new server set up what it builds on first use, the routes a flow run calls
# first among them (the CSRF token route answers 422 when CSRF protection is off)
WARM_UP_REQUESTS = (("/admin/version", None), ("/csrf-token?client=hashdist-warm-up", None),
                    ("/flows/filter", b'{"limit": 1}'), ("/flow_runs/filter", b'{"limit": 1}'))


def _warm_up(port: int) -> None:
    """The server's requests to itself as it starts: a new server builds its routes' models, its database
    mappers and its connection on first use (0.3 to 0.4 s); done now, that work is over by the time the run
    asks, or it is the work the run's first request would have waited for anyway."""
    import urllib.request

    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
    for path, body in WARM_UP_REQUESTS:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/api{path}", data=body,
                                         headers={"Content-Type": "application/json"})
        try:
            direct.open(request, timeout=60).read()
        except urllib.error.HTTPError:  # an answer all the same
            continue
        except OSError:  # the server is stopping
            return
