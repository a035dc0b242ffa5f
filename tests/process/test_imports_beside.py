"""imports_beside: modules imported on a thread while the block runs, all done when it ends."""

from __future__ import annotations

import sys
import threading

import pytest

from aot.process.imports_beside import imports_beside
from tests.log_messages import messages_of


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A module that records the thread it was imported on; removed from sys.modules after the test."""
    (tmp_path / "aot_test_imported_beside.py").write_text("import threading\nTHREAD = threading.current_thread().name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "aot_test_imported_beside"
    sys.modules.pop("aot_test_imported_beside", None)


def test_the_modules_are_imported_on_another_thread_by_the_end_of_the_block(package):
    assert package not in sys.modules
    interval = sys.getswitchinterval()
    with imports_beside([package]):
        assert sys.getswitchinterval() < interval  # the main thread gets the GIL back sooner meanwhile
    assert sys.modules[package].THREAD == "aot-imports"
    assert sys.getswitchinterval() == interval
    assert not any(thread.name == "aot-imports" for thread in threading.enumerate())


def test_a_module_that_fails_to_import_is_left_to_its_user(package):
    with messages_of("aot.process.imports_beside") as messages, imports_beside(["aot_no_such_module", package]):
        pass
    assert package in sys.modules  # the failure stopped nothing after it
    assert any("aot_no_such_module" in message and "ModuleNotFoundError" in message for message in messages)


def test_an_error_in_the_block_still_joins_the_thread(package):
    interval = sys.getswitchinterval()
    with pytest.raises(RuntimeError, match="in the block"), imports_beside([package]):
        raise RuntimeError("in the block")
    assert package in sys.modules
    assert sys.getswitchinterval() == interval


def test_nothing_to_import_starts_no_thread():
    before = threading.active_count()
    with imports_beside([]):
        assert threading.active_count() == before
