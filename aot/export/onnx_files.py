"""Write an ONNX model's files all or nothing, checked: the one write path of the exporter and the file-level optimiser.

- All or nothing: the files are written in a temporary directory beside ``path`` and
  moved into place only once ``onnx.checker.check_model(full_check=True)`` accepts
  them, so a rejection leaves no partial file (and an optimiser's rejection leaves the
  exported files as they were).
- One-line errors: a step that fails (a fusion, the float16 conversion, an optimiser,
  the checker) raises an :class:`ExportError` naming the file and the step, never the
  step's own multi-line report.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import onnx

from aot.errors import ExportError, first_line



def write_checked(path: Path, write: Callable[[Path], None]) -> list[Path]:
    """``write(staged_path)`` the model, check it, then move its files over ``path``'s; return ``path`` and the others."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        staged = staging / path.name
        write(staged)
        with step_errors(path, "onnx.checker rejects the model"):
            onnx.checker.check_model(str(staged), full_check=True)
        written = []
        for produced in sorted(staging.iterdir()):
            final = path.parent / produced.name
            os.replace(produced, final)
            written.append(final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [path] + [item for item in written if item != path]


@contextlib.contextmanager
def step_errors(path: Path, failure: str) -> Iterator[None]:
    """Raise what fails inside as ``ExportError("<file>: <failure>: <error type>: <first line>")``."""
    try:
        yield
    except ExportError:
        raise
    except Exception as error:
        raise ExportError(f"{Path(path).name}: {failure}: {type(error).__name__}: {first_line(error)}") from None


