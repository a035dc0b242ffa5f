"""MemoryWatch: the build's peak is this process plus what its forked children hold alone."""

from __future__ import annotations

import os
import time

import pytest

from aot.forked import ForkedStep, can_fork
from aot.memory import MemoryWatch, private_mib, resident_mib

MIB = 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads /proc")
def test_a_short_lived_allocation_in_this_process_is_in_the_peak():
    watch = MemoryWatch()
    try:
        before = resident_mib()
        block = bytearray(300 * MIB)  # zero-filled: every page is touched
        time.sleep(0.1)
        del block
        assert watch.sampled_peak_mib() >= before + 250
        assert watch.peak_mib() >= watch.sampled_peak_mib()
    finally:
        watch.stop()


@pytest.mark.skipif(not can_fork(), reason="fork is used on Linux only")
def test_a_child_counts_with_its_private_memory_only():
    shared = bytearray(200 * MIB)  # the parent's: shared with the child, counted once
    watch = MemoryWatch()
    try:
        start = resident_mib()
        assert start >= 200

        def allocate():
            block = bytearray(300 * MIB)
            time.sleep(0.6)  # longer than the child sampling interval
            return len(block)

        step = ForkedStep("allocate", allocate, on_child=watch.track)
        assert step.result() == 300 * MIB
        peak = watch.sampled_peak_mib()
        assert peak >= start + 250, (start, peak)  # the child's 300 MiB ...
        assert peak < start + 300 + 150, (start, peak)  # ... but not the 200 MiB it shares with us again
    finally:
        watch.stop()
        del shared


def test_a_process_that_is_gone_holds_nothing():
    assert private_mib(2**22 + 7) == 0.0
    assert resident_mib(2**22 + 7) == 0.0
