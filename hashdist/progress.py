"""Progress of a run's blocks on stderr, for the flows and the local engine alike: a tqdm bar on a terminal,
elsewhere (a log, a pipe, a scheduler's output) a line every PERIOD_S seconds while the run lasts."""

from __future__ import annotations

import sys
import threading
import time

PERIOD_S = 10.0  # off a terminal: seconds between progress lines (none for a run shorter than that)


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


class _Lines(_NoBar):
    """Off a terminal: every PERIOD_S seconds, a line with the blocks done so far, until the run ends."""

    def __enter__(self):
        self.started, self._stop = time.time(), threading.Event()
        self._thread = threading.Thread(target=self._report, name="hashdist-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _report(self) -> None:
        while not self._stop.wait(PERIOD_S):  # ends with the run
            tail = f", {self.postfix}" if self.postfix else ""
            sys.stderr.write(f"hashdist: {self.n} of {self.total} blocks after {time.time() - self.started:.0f} s"
                             f"{tail}\n")
            sys.stderr.flush()


def progress_bar(total: int, enabled: bool):
    """A tqdm bar on stderr when enabled and stderr is a terminal (tqdm is loaded only then), progress lines
    when enabled elsewhere, nothing when not enabled."""
    if not enabled:
        return _NoBar(total)
    if not sys.stderr.isatty():
        return _Lines(total)
    from tqdm import tqdm

    return tqdm(total=total, unit="block", file=sys.stderr, dynamic_ncols=True)


def advance(bar, blocks: int, pairs: int, started: float) -> None:
    """Count ``blocks`` more done on ``bar``, showing the pairs per second since ``started`` (a time.time())."""
    bar.update(blocks)
    bar.set_postfix_str(f"{pairs / max(time.time() - started, 1e-9):.3g} pairs/s")
