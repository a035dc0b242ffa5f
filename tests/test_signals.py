"""Signals: the export child dies with its parent; SIGTERM and SIGINT stop a build cleanly, in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import TINY_BERT

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the forked export and PR_SET_PDEATHSIG are Linux's")


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def _start_build(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(TINY_BERT)
    command = [sys.executable, "-c", "from aot.cli import entry_point; entry_point()", "build", str(recipe), "-o", str(tmp_path / "out")]
    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return process, tmp_path / f".out.aot-tmp-{process.pid}"


def _cmdline(pid: int) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def _forked_children(pid: int) -> list[int]:
    """Children that are forks of ``pid`` (its own command line), not programs it runs: torch 2.15 runs
    ``ldconfig -p`` (``ctypes.util.find_library``) for a few milliseconds at import, and that is no export child."""
    own = _cmdline(pid)
    return [child for child in _children(pid) if own is not None and _cmdline(child) == own]


def _export_child(pid: int) -> int | None:
    """The build's forked export child, once it has outlived the instant between a spawn's fork and its exec."""
    children = _forked_children(pid)
    if not children:
        return None
    time.sleep(0.1)
    return next((child for child in children if child in _forked_children(pid)), None)


def _start_build_in_export(tmp_path: Path) -> tuple[subprocess.Popen, Path, int]:
    process, staging = _start_build(tmp_path)
    assert _wait_until(lambda: _export_child(process.pid) or process.poll() is not None, 120)
    child = _export_child(process.pid)
    assert child is not None and process.poll() is None, "the build must be stopped while its export child runs"
    return process, staging, child


@pytest.mark.artifact
@pytest.mark.parametrize(("signal_number", "code", "message"), [(signal.SIGTERM, 143, "terminated by SIGTERM"), (signal.SIGINT, 130, "interrupted")])
def test_signal_during_export_stops_child_removes_staging_one_line(tmp_path, signal_number, code, message):
    process, staging, child = _start_build_in_export(tmp_path)
    assert staging.is_dir()
    started = time.monotonic()
    os.kill(process.pid, signal_number)  # the main process alone, not its group
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == code, stderr
    assert stderr.strip().splitlines() == [f"aot: error: {message}"], stderr
    assert time.monotonic() - started < 10, "the build does not wait for the export to finish"
    assert not staging.exists() and not (tmp_path / "out").exists()
    assert _wait_until(lambda: not _alive(child), 5), "the export child is stopped"


@pytest.mark.artifact
def test_export_child_dies_when_the_build_is_killed(tmp_path):
    process, _, child = _start_build_in_export(tmp_path)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    assert _wait_until(lambda: not _alive(child), 10), "the export child outlived its SIGKILLed parent"


def _catches(pid: int, signal_number: int) -> bool:
    """Whether the process has a handler of its own for the signal (its SigCgt mask in /proc)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(caught >> (signal_number - 1) & 1)


def test_interrupt_while_importing_is_one_line(tmp_path):
    process, _ = _start_build(tmp_path)
    # aot's handlers are in place (SIGTERM is caught only once they are), the imports of torch
    # and transformers, which take seconds, still to come.
    assert _wait_until(lambda: _catches(process.pid, signal.SIGTERM) or process.poll() is not None, 60)
    time.sleep(0.2)
    assert process.poll() is None
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert stderr.strip().splitlines() == ["aot: error: interrupted"], stderr


LOST_IN_FORK = """
import os, signal, sys, time
import aot.cli as cli
signal.signal(signal.SIGINT, cli._stop)
sys.unraisablehook = cli._send_lost_stop_again
def interrupt_inside_fork():  # the handler then raises inside fork's own callback, where Python swallows it
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)
os.register_at_fork(after_in_parent=interrupt_inside_fork)
try:
    if os.fork() == 0:
        os._exit(0)
    time.sleep(5)
    print("not stopped")
except cli.Stopped as stop:
    print("stopped", stop.exit_code)
"""


def test_a_stop_lost_inside_a_fork_callback_is_sent_again_and_not_printed():
    completed = subprocess.run([sys.executable, "-c", LOST_IN_FORK], capture_output=True, text=True, timeout=60)
    assert completed.stdout.strip() == "stopped 130", completed.stdout + completed.stderr
    assert completed.stderr == "", "no 'Exception ignored in' traceback"
