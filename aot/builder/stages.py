"""Named, timed stages of a long command, each reported as it starts and as it ends.

The library never prints: a command-line front end passes a ``progress`` callback
(``progress(stage, event, seconds)``, event "start" or "done", seconds set on "done")
and decides what to show.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

Progress = Callable[[str, str, float | None], None]


class Stages:
    """``with stages("trace"): ...`` times the block, adds it to ``seconds`` and reports it.

    ``after(stage)`` runs once each stage ends (the build notes the memory peak there).
    """

    def __init__(self, progress: Progress | None = None, after: Callable[[str], None] | None = None):
        self.progress, self.after = progress, after
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        if self.progress:
            self.progress(stage, "start", None)
        started = time.perf_counter()
        yield
        seconds = time.perf_counter() - started
        self.seconds[stage] = round(self.seconds.get(stage, 0.0) + seconds, 3)
        if self.after:
            self.after(stage)
        log.info("%s done in %.2fs", stage, seconds)
        if self.progress:
            self.progress(stage, "done", seconds)
