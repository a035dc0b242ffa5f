"""Run cells in forked children, a few at a time, each under a time limit.

A model that hangs, crashes the interpreter or leaks gigabytes takes down its own
child only: the cell records a timeout or the way the child died, and the table goes
on. Children fork from a parent that has imported torch, transformers and aot but run
nothing, so a cell pays for its model's own module alone. Each child runs torch on one
thread (OpenMP's threads do not survive a fork; one per core is what the pool does instead).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from aot.errors import first_line

_FORK = multiprocessing.get_context("fork")


@dataclass
class Outcome:
    ok: bool
    error: str | None
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "error": self.error, "seconds": round(self.seconds, 1)}


def one_line(error: BaseException) -> str:
    """``Type: first line of the message``, at most 300 characters."""
    return f"{type(error).__name__}: {first_line(error)}"[:300] if str(error).strip() else type(error).__name__


def _child(connection, function: Callable[..., None], args: tuple) -> None:
    import torch

    torch.set_num_threads(1)
    quiet = os.open(os.devnull, os.O_WRONLY)  # the models' own warnings: the table holds what matters
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)
    try:
        function(*args)
        connection.send((True, None))
    except BaseException as error:  # everything a cell raises is its result
        connection.send((False, one_line(error)))
    finally:
        connection.close()


@dataclass
class _Running:
    key: Any
    process: Any
    connection: Any
    started: float


def run_all(
    jobs: Iterable[tuple[Any, Callable[..., None], tuple]], workers: int, timeout_s: float
) -> Iterator[tuple[Any, Outcome]]:
    """``(key, outcome)`` for each ``(key, function, args)`` job, in the order they finish."""
    pending = list(jobs)
    running: list[_Running] = []
    while pending or running:
        while pending and len(running) < workers:
            key, function, args = pending.pop(0)
            receiving, sending = _FORK.Pipe(duplex=False)
            process = _FORK.Process(target=_child, args=(sending, function, args))
            process.start()
            sending.close()
            running.append(_Running(key, process, receiving, time.perf_counter()))
        time.sleep(0.05)
        for job in list(running):
            outcome = _finished(job, timeout_s)
            if outcome is not None:
                running.remove(job)
                yield job.key, outcome


def _finished(job: _Running, timeout_s: float) -> Outcome | None:
    elapsed = time.perf_counter() - job.started
    if not job.connection.poll():
        if job.process.is_alive():
            if elapsed <= timeout_s:
                return None
            job.process.kill()
            job.process.join()
            return Outcome(False, f"timed out after {timeout_s:.0f} s", elapsed)
        if not job.connection.poll():  # it may have reported between the two looks
            job.process.join()
            return Outcome(False, _death(job.process), elapsed)
    try:
        ok, error = job.connection.recv()
    except EOFError:  # it closed the pipe and died without a word
        job.process.join()
        return Outcome(False, _death(job.process), elapsed)
    job.process.join()
    return Outcome(ok, error, elapsed)


def _death(process) -> str:
    code = process.exitcode
    if code is not None and code < 0:
        return f"the child process died (signal {-code})"
    return f"the child exited with {code} before it reported"


def worker_count() -> int:
    return max(1, len(os.sched_getaffinity(0)))
