"""ForkedStep: a build step in a child process, with its result or its error brought back."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from aot.errors import ExportError, PassError
from aot.process.forked import ForkedStep, can_fork

pytestmark = pytest.mark.skipif(not can_fork(), reason="fork is used on Linux only")


def test_the_result_comes_back_and_the_work_happened_elsewhere():
    parent = os.getpid()
    pid, total = ForkedStep("sum", lambda: (os.getpid(), float(torch.arange(10.0).sum()))).result()
    assert pid != parent
    assert total == 45.0


def test_torch_runs_in_the_child_after_the_parent_used_its_threads():
    torch.set_num_threads(2)
    torch.randn(512, 512) @ torch.randn(512, 512)  # start the parent's OpenMP pool before forking
    step = ForkedStep("matmul", lambda: float((torch.ones(256, 256) @ torch.ones(256, 256))[0, 0]))
    assert step.result() == 256.0


def test_an_aot_error_keeps_its_type_and_message():
    def fail():
        raise PassError("pass 'x' (step 1) failed: boom")

    with pytest.raises(PassError, match=r"pass 'x' \(step 1\) failed: boom"):
        ForkedStep("passes", fail).result()


def test_any_other_exception_becomes_a_failure_of_the_named_step():
    def fail():
        raise KeyError("weights")

    with pytest.raises(ExportError, match="export_onnx failed: KeyError: 'weights'"):
        ForkedStep("export_onnx", fail).result()


def test_a_child_that_dies_is_reported_with_its_signal():
    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    with pytest.raises(ExportError, match="export_onnx: the child process died \\(signal SIGKILL\\)"):
        ForkedStep("export_onnx", die).result()


def test_cancel_stops_the_child_at_once():
    seen: list[int] = []
    step = ForkedStep("sleep", lambda: time.sleep(60), on_child=seen.append)
    assert seen and seen[0] == step.pid
    started = time.monotonic()
    step.cancel()
    assert time.monotonic() - started < 5
    with pytest.raises(ChildProcessError):
        os.waitpid(step.pid, os.WNOHANG)  # already reaped: no zombie left behind


def test_a_process_that_uses_cuda_runs_the_step_in_process(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert not can_fork()
    step = ForkedStep("export_onnx", lambda: os.getpid())
    assert step.in_process
    assert step.result() == os.getpid()
