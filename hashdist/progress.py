"""Progress on stderr, for the flows and the local engine alike: a tqdm bar of a run's blocks on a terminal;
elsewhere (a log, a pipe, a scheduler's output) a line every PERIOD_S seconds while the command lasts, each
naming the time since the command started and its phase (starting the cluster, computing blocks n of m,
reducing, writing the report), and a line at once when the phase changes after the first line.

The command line reports a whole command (:func:`reporting`, phases set with :func:`phase`, or by a
:class:`Phases`, which also logs them to a flow's run log); a run's blocks (:func:`progress_bar`) report to it,
or, called from Python with no command reporting, report themselves for as long as they run.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time

PERIOD_S = 10.0  # off a terminal: seconds between progress lines (none for a run shorter than that)


class _Lines:
    """Off a terminal: a line every PERIOD_S seconds with the phase and the time since ``started``, until closed."""

    def __init__(self, started: float, first_phase: str):
        self.started, self.phase, self.lines = started, first_phase, 0
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._thread = threading.Thread(target=self._report, name="hashdist-progress", daemon=True)

    def start(self) -> _Lines:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def set(self, phase: str) -> None:
        """The phase from now on; said at once when lines are already being printed (a long command)."""
        with self._lock:
            changed, self.phase = phase.split(":")[0] != self.phase.split(":")[0], phase
            if changed and self.lines:
                self._line()

    def _line(self) -> None:
        sys.stderr.write(f"hashdist: {time.time() - self.started:.0f} s, {self.phase}\n")
        sys.stderr.flush()
        self.lines += 1

    def _report(self) -> None:
        while not self._stop.wait(PERIOD_S):  # ends with the command
            with self._lock:
                self._line()


_COMMAND: list[_Lines] = []  # the lines of the command being reported (at most one)


@contextlib.contextmanager
def reporting(enabled: bool, first_phase: str, started: float | None = None):
    """Progress lines for a whole command, off a terminal and when ``enabled``: ``first_phase`` until
    :func:`phase` names the next; the time counts from ``started`` (a time.time(), default now)."""
    if not enabled or sys.stderr.isatty() or _COMMAND:
        yield
        return
    lines = _Lines(started or time.time(), first_phase).start()
    _COMMAND.append(lines)
    try:
        yield
    finally:
        _COMMAND.remove(lines)
        lines.close()


def phase(text: str) -> None:
    """The phase of the command being reported (nothing when none is)."""
    for lines in _COMMAND:
        lines.set(text)


TERMINAL_WORDS = {"writing": "writing the report"}  # phases the progress lines name as they start (the others:
# the command's first phase, and the blocks' bar)


class Phases:
    """A run's phases, one after the other, said in two places: a log (a flow's Prefect run logger, or None)
    gets "NAME: started" and "NAME: done in S s"; the command's progress lines (:func:`phase`) the phases of
    ``words`` (default TERMINAL_WORDS) as they start. ``start(name)`` ends the phase in progress and starts the
    next; ``end()`` ends the last. ``prefix``: e.g. a task's name, in the log's lines."""

    def __init__(self, log=None, prefix: str = "", words: dict[str, str] | None = None):
        self.log, self.prefix, self.words = log, prefix, TERMINAL_WORDS if words is None else words
        self.name, self.started = None, 0.0

    def start(self, name: str) -> None:
        self.end()
        self.name, self.started = name, time.perf_counter()
        if name in self.words:
            phase(self.words[name])
        if self.log is not None:
            self.log.info(f"{self.prefix}{name}: started")

    def end(self, detail: str = "") -> float:
        """Ends the phase in progress (``detail`` is added to its log line); its seconds."""
        if self.name is None:
            return 0.0
        elapsed = time.perf_counter() - self.started
        if self.log is not None:
            self.log.info(f"{self.prefix}{self.name}: done in {elapsed:.2f} s{detail}")
        self.name = None
        return elapsed

    def __enter__(self):
        return self

    def __exit__(self, kind, *rest) -> None:
        if kind is None:
            self.end()


class _NoBar:
    """What a run reports progress to when no bar is shown: the part of tqdm's interface the runs use."""

    def __init__(self, total: int):
        self.total = total
        self.n = 0
        self.postfix = ""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix_str(self, text: str) -> None:
        self.postfix = text

    def refresh(self) -> None:
        pass


class _BlockLines(_NoBar):
    """Off a terminal: the blocks done so far as the command's phase; once all are done, "reducing"."""

    def __enter__(self):
        self._own = contextlib.ExitStack()
        self._own.enter_context(reporting(True, "computing blocks"))  # a run called from Python: its own lines
        self._say()
        return self

    def __exit__(self, *exc) -> None:
        self._own.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        self._say()

    def set_postfix_str(self, text: str) -> None:
        self.postfix = text
        self._say()

    def refresh(self) -> None:
        self._say()

    def _say(self) -> None:
        if self.total and self.n >= self.total:
            whose = "blocks'" if self.total != 1 else "block's"
            phase(f"reducing the {self.total} {whose} counts to the metrics")
            return
        of = f" of {self.total}" if self.total else ""
        phase(f"computing blocks: {self.n}{of} done" + (f", {self.postfix}" if self.postfix else ""))


def progress_bar(total: int, enabled: bool):
    """A tqdm bar on stderr when enabled and stderr is a terminal (tqdm is loaded only then), progress lines
    when enabled elsewhere, nothing when not enabled."""
    if not enabled:
        return _NoBar(total)
    if not sys.stderr.isatty():
        return _BlockLines(total)
    from tqdm import tqdm

    return tqdm(total=total, unit="block", file=sys.stderr, dynamic_ncols=True)


def advance(bar, blocks: int, pairs: int, started: float) -> None:
    """Count ``blocks`` more done on ``bar``, showing the pairs per second since ``started`` (a time.time())."""
    bar.update(blocks)
    bar.set_postfix_str(f"{pairs / max(time.time() - started, 1e-9):.3g} pairs/s")
