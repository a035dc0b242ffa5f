"""The build's peak memory: this process's resident set plus what its forked children hold alone.

``ru_maxrss`` sees one process. A build that forks a child for the ONNX export
uses the parent's pages (shared copy-on-write, counted once, in the parent) plus
the child's private pages, so :class:`MemoryWatch` samples the parent every 20 ms
and its children every 250 ms, and keeps the largest sum. A sampled peak can miss a spike shorter
than the interval; the parent's own ``ru_maxrss`` is a floor under it.
"""

from __future__ import annotations

import ctypes
import gc
import resource
import sys
import threading
import time

import torch

from aot.process.libc import function

_INTERVAL_S = 0.02
# Reading a child's private memory walks its page tables under its memory-map lock: often, it
# slows the child's page faults (a 13 s export took 19 s at 20 ms); a child's footprint moves slowly.
_CHILD_INTERVAL_S = 0.25


def resident_mib(pid: int | str = "self") -> float:
    """The resident set of ``pid`` now (Linux; 0 where /proc is missing)."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * resource.getpagesize() / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


def private_mib(pid: int) -> float:
    """Memory only ``pid`` maps: its private pages, clean or dirty (0 once it is gone)."""
    total_kib = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    total_kib += int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return 0.0
    return total_kib / 1024


def max_rss_mib() -> float:
    """This process's peak resident set so far (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**20 if sys.platform == "darwin" else 2**10)


class MemoryWatch:
    """Samples this process and the children given to :meth:`track` until :meth:`stop`."""

    def __init__(self) -> None:
        self._children: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sampled_peak = 0.0
        self._children_mib = 0.0
        self._children_sampled_at = 0.0
        # The sampling thread numbers its samples: the last begun, the last finished, the last finished
        # that read the children too. wait_for_sample waits on these for one taken after a given moment.
        self._sample_progress = threading.Condition()
        self._samples_begun = 0
        self._samples_finished = 0
        self._children_samples_finished = 0
        self.start_mib = resident_mib()
        self._thread = threading.Thread(target=self._sample_until_stopped, name="aot-memory-watch", daemon=True)
        self._thread.start()

    def track(self, pid: int) -> None:
        with self._lock:
            self._children.add(pid)
        self._sample()

    def peak_mib(self) -> float:
        """The sampled peak, or this process's own ``ru_maxrss`` where that is higher (it counts since start)."""
        return round(max(self.sampled_peak_mib(), max_rss_mib()), 1)

    def sampled_peak_mib(self) -> float:
        """The largest sum of this process and its children seen while watching."""
        self._sample()
        return round(self._sampled_peak, 1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        with self._sample_progress:
            self._sample_progress.notify_all()  # a waiter's sample will never come

    def wait_for_sample(self, children_too: bool = False, timeout_s: float = 10.0) -> bool:
        """Wait until the sampling thread has finished a sample it began after this call.

        With ``children_too``, a sample that also read the tracked children (the thread reads
        them less often). True once there is one; False if the watch stopped or ``timeout_s``
        passed first. Tests use it to know, rather than guess with sleeps, that the thread saw
        an allocation.
        """
        with self._sample_progress:
            wanted = self._samples_begun + 1

            def taken() -> bool:
                return (self._children_samples_finished if children_too else self._samples_finished) >= wanted

            self._sample_progress.wait_for(lambda: taken() or self._stop.is_set(), timeout_s)
            return taken()

    def _sample(self, children_too: bool = True) -> bool:
        """Take one sample; True when it read the children's memory too."""
        with self._lock:
            children = list(self._children)
        now = time.monotonic()
        read_children = children_too or now - self._children_sampled_at >= _CHILD_INTERVAL_S
        if read_children:
            self._children_mib = sum(private_mib(pid) for pid in children)
            self._children_sampled_at = now
            with self._lock:
                self._children.difference_update(pid for pid in children if resident_mib(pid) == 0.0)
        total = resident_mib() + self._children_mib
        with self._lock:
            self._sampled_peak = max(self._sampled_peak, total)
        return read_children

    def _sample_until_stopped(self) -> None:
        while not self._stop.wait(_INTERVAL_S):
            with self._sample_progress:
                self._samples_begun += 1
                number = self._samples_begun
            read_children = self._sample(children_too=False)
            with self._sample_progress:
                self._samples_finished = number
                if read_children:
                    self._children_samples_finished = number
                self._sample_progress.notify_all()


_MADV_PAGEOUT = 21  # linux/mman.h, Linux 5.4 and later


def page_out(tensor: torch.Tensor) -> bool:
    """Let the kernel take back the whole pages under ``tensor`` that it can read back from a file.

    For a view of a mapped file (a safetensors weight transformers loaded) that was copied and
    will not be read again: its pages would otherwise stay resident until the mapping goes.
    ``MADV_PAGEOUT`` drops only clean file-backed pages (anonymous memory keeps its values: it
    could only be swapped), so a wrong call loses nothing. False where Linux or the call is missing.

    ``aot.export.standalone_runtime.pack_then_page_out`` pages out the same way inside a saved
    ``module.py``, which may not import aot; importing it from here would load aot.export's ONNX
    stack (0.6 s) while the model loads, which the build imports beside the weights on purpose.
    """
    madvise = function("madvise")
    if madvise is None or not sys.platform.startswith("linux") or tensor.device.type != "cpu":
        return False
    page = resource.getpagesize()
    start = tensor.data_ptr()
    first, end = -(-start // page) * page, (start + tensor.numel() * tensor.element_size()) // page * page
    if end <= first:
        return False
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return madvise(first, end - first, _MADV_PAGEOUT) == 0


def release_freed_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc keeps them otherwise)."""
    gc.collect()
    malloc_trim = function("malloc_trim")
    if malloc_trim is not None:
        malloc_trim(0)
