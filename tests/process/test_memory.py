"""MemoryWatch: the build's peak is this process plus what its forked children hold alone.

The sampling thread runs on its own clock, so these tests never sleep and hope it ran:
they hold an allocation until ``MemoryWatch.wait_for_sample`` says the thread has taken a
sample since, and a forked child holds its memory until the parent says it may let go.
"""

from __future__ import annotations

import os

import pytest

from aot.process.forked import ForkedStep, can_fork
from aot.process.memory import MemoryWatch, private_mib, resident_mib

MIB = 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads /proc")
def test_a_short_lived_allocation_in_this_process_is_in_the_peak():
    watch = MemoryWatch()
    try:
        before = resident_mib()
        block = bytearray(300 * MIB)  # zero-filled: every page is touched
        assert resident_mib() >= before + 250, "precondition: the block is resident"
        assert watch.wait_for_sample(), "the sampling thread took no sample"
        del block
        # Gone from the resident set: only the thread's sample, taken while the block lived,
        # can put it in the peak (sampled_peak_mib samples again, now without it).
        assert resident_mib() < before + 250, "precondition: the block was given back"
        assert watch.sampled_peak_mib() >= before + 250
        assert watch.peak_mib() >= before + 250  # the figure the build reports
    finally:
        watch.stop()


@pytest.mark.skipif(not can_fork(), reason="fork is used on Linux only")
def test_a_child_counts_with_its_private_memory_only():
    shared = bytearray(200 * MIB)  # the parent's: shared with the child, counted once
    allocated_read, allocated_write = os.pipe()  # the child says its block is resident
    release_read, release_write = os.pipe()  # the parent says the child may let go of it
    parent_descriptors = {allocated_read, allocated_write, release_read, release_write}
    watch = MemoryWatch()
    step = None
    try:
        start = resident_mib()
        assert start >= 200

        def allocate():
            block = bytearray(300 * MIB)
            os.write(allocated_write, b"1")
            os.read(release_read, 1)
            return len(block)

        step = ForkedStep("allocate", allocate, on_child=watch.track)
        os.close(allocated_write)  # the child's copy is the only one left: its death reads as end of file
        parent_descriptors.discard(allocated_write)
        assert os.read(allocated_read, 1) == b"1", "the child died before it allocated"
        assert private_mib(step.pid) >= 290, "precondition: the child's block is its own"
        assert watch.wait_for_sample(children_too=True), "the sampling thread never read the child"
        os.write(release_write, b"1")
        assert step.result() == 300 * MIB
        peak = watch.sampled_peak_mib()
        assert peak >= start + 250, (start, peak)  # the child's 300 MiB ...
        assert peak < start + 300 + 150, (start, peak)  # ... but not the 200 MiB it shares with us again
    finally:
        if step is not None:
            step.cancel()  # a no-op once the result came back
        for descriptor in parent_descriptors:
            os.close(descriptor)
        watch.stop()
        del shared


def test_a_process_that_is_gone_holds_nothing():
    assert private_mib(2**22 + 7) == 0.0
    assert resident_mib(2**22 + 7) == 0.0
