"""The ``hashdist`` console script: the temporary Prefect API server first when the command needs one, then
the CLI. Only the standard library (and the server's own module) at import, so the server boots while the
CLI loads hashdist, Prefect and Dask."""

from __future__ import annotations

import gc
import os
import sys

from flows.apiserver import TemporaryAPIServer

# the commands with an --engine option that defaults to flow (the parser reads this too)
FLOW_COMMANDS = ("evaluate", "compare", "groundtruth")


def wants_server(argv: list[str]) -> bool:
    """Whether the command line ``argv`` will run a flow on a temporary API server: a flow command, no
    ``--engine local`` (or an abbreviation), no help, and no ``$PREFECT_API_URL``.

    A guess from the words alone, before the parser exists: the CLI stops a server it then does not use,
    and starts one itself if it needs one and none was started.
    """
    if os.environ.get("PREFECT_API_URL") or "-h" in argv or "--help" in argv:
        return False
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in FLOW_COMMANDS:
        return False
    for i, arg in enumerate(argv):
        name, _, value = arg.partition("=")
        if len(name) > 4 and "--engine".startswith(name):
            value = value or (argv[i + 1] if i + 1 < len(argv) else "")
            if value != "flow":
                return False
    return True


def launch() -> int:
    """The ``hashdist`` command: the temporary API server first when the command needs one, then the CLI.

    Python's cyclic garbage collector is off while the command's modules load (``hashdist.cli.app`` turns it back
    on, with what is loaded frozen, when the command starts): loading makes objects that live as long as the
    process, and the collector would walk them over and over (0.2-0.3 s of the 1.4 s that hashdist, Prefect and
    Dask take to load)."""
    gc.disable()
    server = TemporaryAPIServer() if wants_server(sys.argv[1:]) else None
    from hashdist.cli.app import console

    return console(server=server, collector_paused=True)
