"""Ctrl-C (SIGINT) and SIGTERM while a command runs: the run unwinds, then exit status 130 or 143.

Python raises a signal's exception wherever the main thread happens to be, and some of those places lose
it: a garbage-collector callback (distributed's GC diagnosis) prints and drops it, and a Python callback
called from compiled code (pydantic's serializer, which Prefect calls for every task it submits) turns it
into an ordinary error. A run could then finish as if it had not been signalled, or fail with a traceback.
So the command also watches for the signals with :func:`signal.set_wakeup_fd`, which sees them whichever
handler runs (during a flow run Prefect installs its own for SIGTERM). Once one has come, a thread delivers
it again every REDELIVER_S seconds until the command ends. The handler raises only when no interrupt is
already unwinding the main thread, so the cleanup of a run that is stopping (a per-run cluster cancelling
its jobs) is not itself interrupted.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import threading
import time

REDELIVER_S = 1.0
MAX_REDELIVERIES = 120  # then the run goes on; the command still exits with the signal's status
EXIT_GRACE_S = 30.0  # a command a signal ended: the process is gone by then, whatever thread the run left behind
EXIT_STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143}
MESSAGE = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as Ctrl-C's KeyboardInterrupt is."""


def _interrupts(exc: BaseException | None):
    """``exc`` and the exceptions it was raised from or while handling, those that are not errors
    (KeyboardInterrupt, Terminated, Prefect's TerminationSignal)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if not isinstance(exc, Exception):
            yield exc
        exc = exc.__cause__ or exc.__context__


def signal_behind(exc: BaseException) -> int | None:
    """The signal an exception comes from, if any: SIGTERM for Terminated and Prefect's TerminationSignal,
    SIGINT for another KeyboardInterrupt."""
    for interrupt in _interrupts(exc):
        if isinstance(interrupt, Terminated) or type(interrupt).__name__ == "TerminationSignal":
            return signal.SIGTERM
        if isinstance(interrupt, KeyboardInterrupt):
            return signal.SIGINT
    return None


class SignalWatch:
    """While entered (in the main thread): SIGINT raises KeyboardInterrupt and SIGTERM raises Terminated,
    delivered again until the command ends; ``received`` is the first of them to come. Elsewhere it does
    nothing."""

    def __init__(self):
        self.received: int | None = None
        self._ended = threading.Event()
        self._lock = threading.Lock()
        self._active = False

    def __enter__(self) -> SignalWatch:
        if threading.current_thread() is not threading.main_thread():
            return self
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        self._before_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        self._before = {s: signal.signal(s, self._handle) for s in EXIT_STATUS}
        self._active = True
        threading.Thread(target=self._watch, name="hashdist-signals", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        if not self._active:
            return
        with self._lock:  # no delivery after this: the handlers before may be the default, which kills
            self._ended.set()
        for s, handler in self._before.items():
            signal.signal(s, handler)
        signal.set_wakeup_fd(self._before_fd)
        self._reader.close()
        self._writer.close()

    def _handle(self, signum, frame) -> None:
        self.received = self.received or signum
        if next(_interrupts(sys.exc_info()[1]), None) is None:  # else an interrupt is unwinding already
            raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt

    def _take(self) -> int | None:
        """Reads the wakeup bytes there are (the caller holds the lock): the SIGINT or SIGTERM among them,
        also kept as ``received`` if it is the first."""
        try:
            data = self._reader.recv(64)
        except (BlockingIOError, InterruptedError):
            return None
        signum = next((s for s in data if s in EXIT_STATUS), None)
        self.received = self.received or signum
        return signum

    def _watch(self) -> None:
        """Waits for the first SIGINT or SIGTERM, then delivers it again until the command ends."""
        signum = None
        while signum is None:
            try:
                ready, _, _ = select.select([self._reader], [], [], 0.5)
                with self._lock:
                    if self._ended.is_set():
                        return
                    signum = self._take() if ready else None
            except (OSError, ValueError):  # closed: the command has ended
                return
        for _ in range(MAX_REDELIVERIES):
            if self._ended.wait(REDELIVER_S):
                return
            with self._lock:
                if self._ended.is_set():
                    return
                signal.pthread_kill(threading.main_thread().ident, signum)

    def ending(self, exc: BaseException | None = None) -> tuple[int, str] | None:
        """(exit status, word) of a command that received a signal, or that ``exc``, raised from one, ended."""
        with self._lock:
            if self._active and not self._ended.is_set():
                self._take()  # a signal that came a moment ago
            signum = self.received or (signal_behind(exc) if exc is not None else None)
        return (EXIT_STATUS[signum], MESSAGE[signum]) if signum else None


def exit_within(seconds: float, status: int) -> None:
    """Ends the process with ``status`` if it is still there ``seconds`` from now: a run cut short by a signal
    can leave a thread that never ends (a cluster half started), and the interpreter waits for it at exit."""

    def end():
        time.sleep(seconds)
        sys.stderr.write(f"hashdist: still running {seconds:g} s after the command ended: exiting now\n")
        sys.stderr.flush()
        os._exit(status)

    threading.Thread(target=end, name="hashdist-exit", daemon=True).start()
