"""Progress bars of blocks on stderr, for the flows and the local engine alike."""

from __future__ import annotations

import sys
import time


class _NoBar:
    """What a run reports progress to when no bar is shown: the part of tqdm's interface the runs use."""

    def __init__(self, total: int):
        self.total = total

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, text: str) -> None:
        pass

    def refresh(self) -> None:
        pass


def progress_bar(total: int, enabled: bool):
    """A tqdm bar on stderr, shown only when enabled and stderr is a terminal (tqdm is loaded only then)."""
    if not (enabled and sys.stderr.isatty()):
        return _NoBar(total)
    from tqdm import tqdm

    return tqdm(total=total, unit="block", file=sys.stderr, dynamic_ncols=True)


def advance(bar, blocks: int, pairs: int, started: float) -> None:
    """Count ``blocks`` more done on ``bar``, showing the pairs per second since ``started`` (a time.time())."""
    bar.update(blocks)
    bar.set_postfix_str(f"{pairs / max(time.time() - started, 1e-9):.3g} pairs/s")
