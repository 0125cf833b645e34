"""The ``hashdist`` console script: what a command needs besides the CLI started first, then the CLI. Only the
standard library (and the server's own module) at import, so what is started runs while the CLI loads hashdist,
Prefect and Dask: a flow run's temporary Prefect API server, or, for a first run computing in this process, the
process that compiles part of the metric functions (:mod:`hashdist.engine.precompile`)."""

from __future__ import annotations

import gc
import os
import sys

from flows.apiserver import TemporaryAPIServer

# the commands with an --engine option that defaults to flow (the parser reads this too)
FLOW_COMMANDS = ("evaluate", "compare", "groundtruth")
# the commands whose --engine local run computes the metrics in this process (groundtruth computes none)
METRIC_COMMANDS = ("evaluate", "compare")


def _command_and_engine(argv: list[str]) -> tuple[str | None, str]:
    """The command of ``argv`` (None with help, or without a command) and its --engine (or an abbreviation):
    "flow" unless given."""
    if "-h" in argv or "--help" in argv:
        return None, "flow"
    command = next((a for a in argv if not a.startswith("-")), None)
    engine = "flow"
    for i, arg in enumerate(argv):
        name, _, value = arg.partition("=")
        if len(name) > 4 and "--engine".startswith(name):
            engine = value or (argv[i + 1] if i + 1 < len(argv) else "")
    return command, engine


def wants_server(argv: list[str]) -> bool:
    """Whether the command line ``argv`` will run a flow on a temporary API server: a flow command, no
    ``--engine local`` (or an abbreviation), no help, and no ``$PREFECT_API_URL``.

    A guess from the words alone, before the parser exists: the CLI stops a server it then does not use,
    and starts one itself if it needs one and none was started.
    """
    command, engine = _command_and_engine(argv)
    return not os.environ.get("PREFECT_API_URL") and command in FLOW_COMMANDS and engine == "flow"


def wants_precompile(argv: list[str]) -> bool:
    """Whether the command line ``argv`` computes metrics in this process (evaluate or compare with
    ``--engine local``, no help) where the stamp of :mod:`hashdist.engine.precompile` does not show the metric
    functions cached. A guess, as :func:`wants_server`: the process started checks numba's cache and exits at
    once when they are there, and ends with this process."""
    command, engine = _command_and_engine(argv)
    if command not in METRIC_COMMANDS or engine != "local":
        return False
    from hashdist.engine import precompile

    return not precompile.looks_cached()


def launch() -> int:
    """The ``hashdist`` command: the temporary API server first when the command needs one (or a first run's
    compiling process when it computes in this process), then the CLI.

    Python's cyclic garbage collector is off while the command's modules load (``hashdist.cli.app`` turns it back
    on, with what is loaded frozen, when the command starts): loading makes objects that live as long as the
    process, and the collector would walk them over and over (0.2-0.3 s of the 1.4 s that hashdist, Prefect and
    Dask take to load)."""
    gc.disable()
    argv = sys.argv[1:]
    server = TemporaryAPIServer() if wants_server(argv) else None
    if wants_precompile(argv):
        from hashdist.engine import precompile

        precompile.start_early()
    from hashdist.cli.app import console

    return console(server=server, collector_paused=True)
